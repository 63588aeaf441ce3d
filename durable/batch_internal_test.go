package durable

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
)

// held makes b see its pool exhausted and one statement of its own in
// flight, so that the requests that follow queue, and returns a function
// that lets them go: once n requests are queued, it ends that statement, the
// queue goes as statements of many, and it waits for them to have been sent
// and answered (b idle again).
func held[Req, Res any](t *testing.T, b *batcher[Req, Res]) (sent func(n int), statements *atomic.Int64) {
	t.Helper()
	statements = new(atomic.Int64)
	many := b.many
	b.many = func(ctx context.Context, reqs []*Req) ([]Res, error) {
		statements.Add(1)
		return many(ctx, reqs)
	}
	b.mu.Lock()
	b.exhausted = func() bool { return true }
	b.running = 1
	b.mu.Unlock()
	return func(n int) {
		t.Helper()
		queued := func() int {
			b.mu.Lock()
			defer b.mu.Unlock()
			return len(b.queue)
		}
		require.Eventually(t, func() bool { return queued() == n }, 30*time.Second, time.Millisecond, "%d requests queue", n)
		b.finished(time.Time{}, 1, false) // the held statement: no latency to tell
		require.Eventually(t, func() bool {
			b.mu.Lock()
			defer b.mu.Unlock()
			return len(b.queue) == 0 && b.running == 0
		}, 30*time.Second, time.Millisecond, "the queue is sent and answered")
	}, statements
}

func claimParams(scope, key, body string) idem.ClaimParams {
	var owner idem.Token
	_, _ = rand.Read(owner[:])
	return idem.ClaimParams{Scope: scope, Key: key, Fingerprint: sha256.Sum256([]byte(body)), Owner: owner, Hold: time.Minute}
}

type claimed struct {
	rec     idem.Record
	claimed bool
	err     error
}

// claimAll runs a Claim of each of ps at once and returns their results in
// order once all have returned.
func claimAll(ctx context.Context, s *Store, ps []idem.ClaimParams) (func() []claimed, []context.CancelFunc) {
	out := make([]claimed, len(ps))
	cancels := make([]context.CancelFunc, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		cctx, cancel := context.WithCancel(ctx)
		cancels[i] = cancel
		wg.Go(func() {
			out[i].rec, out[i].claimed, out[i].err = s.Claim(cctx, p)
		})
	}
	return func() []claimed { wg.Wait(); return out }, cancels
}

// Queued claims go as one statement, and each gets its own key's result: a
// new key is claimed, an answered key returns its answer, a key in progress
// its owner's row, a released key of the same request is taken over, and a
// key twice in the queue goes once per statement, with exactly one winner.
func TestBatchedClaimsGetTheirOwnRows(t *testing.T) {
	for _, c := range []struct {
		parts       int
		insertFirst bool
	}{{0, false}, {4, false}, {0, true}, {4, true}} {
		t.Run(fmt.Sprintf("partitions=%d/insert-first=%v", c.parts, c.insertFirst), func(t *testing.T) {
			ctx := t.Context()
			s, pool := planStoreOf(t, &Config{Partitions: c.parts})
			require.NotNil(t, s.claims, "a Store over a pool batches its claims")
			s.newKeys.Pin(c.insertFirst)

			answered, running, released := claimParams("u1", "answered", "a"), claimParams("u1", "running", "r"), claimParams("u2", "released", "x")
			expired := claimParams("u3", "expired", "old")
			for _, p := range []idem.ClaimParams{answered, running, released, expired} {
				_, won, err := s.Claim(ctx, p)
				require.NoError(t, err)
				require.True(t, won)
			}
			answer := idem.Response{Status: 402, Header: http.Header{"Location": {"/orders/1"}}, Body: []byte("declined")}
			require.NoError(t, s.Complete(ctx, "u1", "answered", answered.Owner, answer))
			require.NoError(t, s.Release(ctx, "u2", "released", released.Owner))
			require.NoError(t, s.Complete(ctx, "u3", "expired", expired.Owner, answer))
			_, err := pool.Exec(ctx, `UPDATE `+s.table+` SET completed_at = now() - $1::bigint * interval '1 microsecond' - interval '1 hour'
				WHERE key = 'expired'`, s.retention)
			require.NoError(t, err)

			send, statements := held(t, s.claims)
			ps := []idem.ClaimParams{
				claimParams("u1", "new-1", "n"), claimParams("u2", "new-2", "n"), claimParams("u3", "new-3", "n"),
				claimParams("u1", "answered", "a"),
				claimParams("u1", "running", "r"),
				claimParams("u2", "released", "x"),
				claimParams("u4", "twice", "t"), claimParams("u4", "twice", "t"),
				claimParams("u3", "expired", "new"),
			}
			wait, _ := claimAll(ctx, s, ps)
			send(len(ps))
			got := wait()
			require.EqualValues(t, 1, statements.Load(), "one statement for the queue; the key it had twice goes after it, alone")
			for _, r := range got {
				require.NoError(t, r.err)
			}
			var rows int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+s.table+` WHERE key LIKE 'new-%'`).Scan(&rows))
			require.Equal(t, 3, rows, "each new key inserted once")

			for i := range 3 {
				require.NoError(t, got[i].err)
				require.True(t, got[i].claimed, "%s is new: claimed", ps[i].Key)
				require.Equal(t, ps[i].Owner, got[i].rec.Owner)
				require.Equal(t, ps[i].Scope, got[i].rec.Scope)
			}
			require.NoError(t, got[3].err)
			require.False(t, got[3].claimed)
			require.True(t, answer.Equal(*got[3].rec.Answer), "the answered key's answer: %+v", got[3].rec.Answer)
			require.NoError(t, got[4].err)
			require.False(t, got[4].claimed)
			require.Equal(t, running.Owner, got[4].rec.Owner, "the running key's owner")
			require.NoError(t, got[5].err)
			require.True(t, got[5].claimed, "the released key is taken over by the same request")
			require.Equal(t, 2, got[5].rec.Attempt)
			require.NoError(t, got[6].err)
			require.NoError(t, got[7].err)
			require.True(t, got[6].claimed != got[7].claimed, "one winner of the key sent twice")
			winner := ps[6].Owner
			if got[7].claimed {
				winner = ps[7].Owner
			}
			require.Equal(t, winner, got[6].rec.Owner)
			require.Equal(t, winner, got[7].rec.Owner)
			require.NoError(t, got[8].err)
			require.True(t, got[8].claimed, "the expired key is taken over as a new intent")
			require.Equal(t, 1, got[8].rec.Attempt)
			require.Equal(t, ps[8].Fingerprint, got[8].rec.Fingerprint)
			require.Nil(t, got[8].rec.Answer)
		})
	}
}

// A claim whose caller gives up while it is queued is never sent; one
// refused by the server does not fail the claims it was sent with: each runs
// alone, and only the faulty one fails.
func TestBatchedClaimsGiveUpAndFailAlone(t *testing.T) {
	ctx := t.Context()
	s, pool := planStoreOf(t, &Config{})
	send, statements := held(t, s.claims)

	// A key too long for the primary key's index (random, so that it does
	// not compress below btree's limit): the server refuses the statement.
	var b strings.Builder
	for b.Len() < 20_000 {
		b.WriteString(rand.Text())
	}
	huge := b.String()
	ps := []idem.ClaimParams{claimParams("u1", "gone", "g"), claimParams("u1", "fine-1", "f"), claimParams("u1", huge, "h"), claimParams("u1", "fine-2", "f")}
	wait, cancels := claimAll(ctx, s, ps)
	require.Eventually(t, func() bool {
		s.claims.mu.Lock()
		defer s.claims.mu.Unlock()
		return len(s.claims.queue) == len(ps)
	}, 30*time.Second, time.Millisecond)
	cancels[0]()
	send(len(ps) - 1)
	got := wait()

	require.ErrorIs(t, got[0].err, context.Canceled)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+s.table+` WHERE key = 'gone'`).Scan(&n))
	require.Zero(t, n, "the claim given up while queued was never sent")

	require.EqualValues(t, 1, statements.Load(), "the three went as one statement")
	for _, i := range []int{1, 3} {
		require.NoError(t, got[i].err, "%s", ps[i].Key)
		require.True(t, got[i].claimed, "%s claimed alone after the statement was refused", ps[i].Key)
	}
	require.Error(t, got[2].err, "the key too long fails")
	require.False(t, got[2].claimed)
}

// Queued answer writes go as one statement: each is stored, except one
// whose owner no longer holds the row, which is told so, as alone; with
// Notify each written key is announced.
func TestBatchedAnswers(t *testing.T) {
	for _, notify := range []bool{false, true} {
		name := "notify=false"
		if notify {
			name = "notify=true"
		}
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			s, pool := planStoreOf(t, &Config{Notify: notify})
			ps := []idem.ClaimParams{claimParams("u1", "a", "a"), claimParams("u2", "b", "b"), claimParams("u3", "c", "c")}
			for _, p := range ps {
				_, won, err := s.Claim(ctx, p)
				require.NoError(t, err)
				require.True(t, won)
			}
			var heard []string
			var listening sync.WaitGroup
			if notify {
				conn, err := pool.Acquire(ctx)
				require.NoError(t, err)
				defer conn.Release()
				_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize())
				require.NoError(t, err)
				listening.Go(func() {
					for range 2 {
						n, err := conn.Conn().WaitForNotification(ctx)
						if err != nil {
							return
						}
						heard = append(heard, n.Payload)
					}
				})
			}

			send, statements := held(t, s.answers)
			answers := []idem.Response{{Status: 201, Body: []byte("a")}, {Status: 402, Body: []byte("b")}, {Status: 201, Body: []byte("c")}}
			owners := []idem.Token{ps[0].Owner, ps[1].Owner, {9}} // the third is not the owner
			errs := make([]error, len(ps))
			var wg sync.WaitGroup
			for i, p := range ps {
				wg.Go(func() { errs[i] = s.Complete(ctx, p.Scope, p.Key, owners[i], answers[i]) })
			}
			send(len(ps))
			wg.Wait()
			require.EqualValues(t, 1, statements.Load())
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
			require.ErrorIs(t, errs[2], idem.ErrNotOwner)
			for i, p := range ps {
				rec, err := s.Get(ctx, p.Scope, p.Key)
				require.NoError(t, err)
				if i == 2 {
					require.True(t, rec.InProgress(), "the wrong owner's answer is not stored")
					continue
				}
				require.True(t, answers[i].Equal(*rec.Answer), "%s: %+v", p.Key, rec.Answer)
			}
			if notify {
				listening.Wait()
				require.ElementsMatch(t, []string{keyTag("u1", "a"), keyTag("u2", "b")}, heard)
			}
		})
	}
}

// A Store bound to a caller's transaction never batches: its statements are
// the caller's to order.
func TestJoinedStoreDoesNotBatch(t *testing.T) {
	s, pool := planStoreOf(t, &Config{})
	tx, err := pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(t.Context())) }()
	j := s.WithDB(tx)
	require.Nil(t, j.claims)
	require.Nil(t, j.answers)
}

// Many callers at once, each claiming fresh keys and answering them, with
// the pool seen as always exhausted (every request that finds a statement of
// its kind in flight waits and shares the next) and with the pool's own
// state: every claim wins, every answer is stored, and the table holds
// exactly the answers given.
func TestBatchedClaimsAndAnswersUnderLoad(t *testing.T) {
	for _, exhausted := range []bool{true, false} {
		t.Run(fmt.Sprintf("always_exhausted=%v", exhausted), func(t *testing.T) {
			s, pool := planStoreOf(t, &Config{})
			if exhausted {
				s.claims.exhausted = func() bool { return true }
				s.answers.exhausted = func() bool { return true }
			}
			const callers, each = 32, 40
			var wg sync.WaitGroup
			errs := make(chan error, callers*each)
			for c := range callers {
				wg.Go(func() {
					for i := range each {
						p := claimParams(fmt.Sprintf("u%d", c), fmt.Sprintf("k%d", i), "b")
						_, won, err := s.Claim(t.Context(), p)
						if err != nil || !won {
							errs <- fmt.Errorf("claim %s/%s: won=%v: %w", p.Scope, p.Key, won, err)
							continue
						}
						a := idem.Response{Status: 201, Body: []byte(p.Scope + "/" + p.Key)}
						if err := s.Complete(t.Context(), p.Scope, p.Key, p.Owner, a); err != nil {
							errs <- fmt.Errorf("complete %s/%s: %w", p.Scope, p.Key, err)
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			var answered, right int
			require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*), count(*) FILTER (WHERE response_body = convert_to(user_id || '/' || key, 'UTF8'))
				FROM `+s.table+` WHERE response_status = 201`).Scan(&answered, &right))
			require.Equal(t, callers*each, answered)
			require.Equal(t, answered, right, "each row holds its own answer")
		})
	}
}

// A statement of many whose reply is lost after its commit (here: the real
// statement, then a connection error) leaves each of its claims ambiguous,
// as one alone would be: every caller gets the error, never another
// request's result, and each can give its claim back with its own owner
// token, after which the next claim of the same request runs as the next
// attempt.
func TestBatchedClaimsLostReplyIsEachCallersAmbiguity(t *testing.T) {
	for _, insertFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("insert-first=%v", insertFirst), func(t *testing.T) {
			ctx := t.Context()
			s, _ := planStoreOf(t, &Config{})
			s.newKeys.Pin(insertFirst)
			lost := errors.New("connection reset after the commit")
			many := s.claims.many
			s.claims.many = func(ctx context.Context, reqs []*claimReq) ([]claimRes, error) {
				if _, err := many(ctx, reqs); err != nil {
					return nil, err
				}
				return nil, lost
			}
			send, _ := held(t, s.claims)
			ps := []idem.ClaimParams{claimParams("u1", "a", "a"), claimParams("u2", "b", "b"), claimParams("u3", "c", "c")}
			wait, _ := claimAll(ctx, s, ps)
			send(len(ps))
			for i, got := range wait() {
				require.ErrorIs(t, got.err, lost, "%s: the lost reply is the caller's error", ps[i].Key)
				require.False(t, got.claimed)
			}
			s.claims.many = many
			for _, p := range ps {
				require.NoError(t, s.Release(ctx, p.Scope, p.Key, p.Owner), "%s: given back by its own owner", p.Key)
				retry := p
				retry.Owner = claimParams("", "", "").Owner
				rec, won, err := s.Claim(ctx, retry)
				require.NoError(t, err)
				require.True(t, won, "%s: the retry runs", p.Key)
				require.Equal(t, 2, rec.Attempt)
			}
		})
	}
}

// A Store over a pool shares statements only when its statements in flight
// take every connection: claims made one after another each go alone; with
// as many claims in flight as the pool has connections (held here by the
// test, so that they wait), the claims that come meanwhile wait for them,
// then go together as one statement.
func TestStoreSharesOnlyWhenThePoolIsExhausted(t *testing.T) {
	ctx := t.Context()
	s0, pool0 := planStoreOf(t, &Config{})
	cfg, err := pgxpool.ParseConfig(pool0.Config().ConnString())
	require.NoError(t, err)
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := New(pool, &s0.cfg)
	require.NoError(t, err)
	var shared atomic.Int64
	many := s.claims.many
	s.claims.many = func(ctx context.Context, reqs []*claimReq) ([]claimRes, error) {
		shared.Add(int64(len(reqs)))
		return many(ctx, reqs)
	}

	for i := range 5 {
		_, won, err := s.Claim(ctx, claimParams("u", fmt.Sprintf("alone-%d", i), "b"))
		require.NoError(t, err)
		require.True(t, won)
	}
	require.Zero(t, shared.Load(), "claims one after another go alone")

	var conns []*pgxpool.Conn
	for range 2 {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	state := func() (running, queued int) {
		s.claims.mu.Lock()
		defer s.claims.mu.Unlock()
		return s.claims.running, len(s.claims.queue)
	}
	first := []idem.ClaimParams{claimParams("u", "first-1", "b"), claimParams("u", "first-2", "b")}
	waitFirst, _ := claimAll(ctx, s, first)
	require.Eventually(t, func() bool { r, _ := state(); return r == len(first) }, 30*time.Second, time.Millisecond)
	rest := []idem.ClaimParams{claimParams("u", "b", "b"), claimParams("u", "c", "b"), claimParams("u", "d", "b")}
	waitRest, _ := claimAll(ctx, s, rest)
	require.Eventually(t, func() bool { _, q := state(); return q == len(rest) }, 30*time.Second, time.Millisecond,
		"with the pool's connections all taken, the claims behind wait")
	for _, c := range conns {
		c.Release()
	}
	for _, got := range append(waitFirst(), waitRest()...) {
		require.NoError(t, got.err)
		require.True(t, got.claimed)
	}
	require.EqualValues(t, len(rest), shared.Load(), "the claims that waited went as one statement")
}
