package idem_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/testdb"
	"github.com/idemguard/idem/internal/testredis"
	"github.com/idemguard/idem/lock"
)

// leaseRig is a hybrid Guard over a counting store, with the Redis it leases
// in and, under miniredis, the server for FastForward.
type leaseRig struct {
	guard  *idem.Guard
	store  *durable.Store
	count  *countingStore
	locker *lock.Locker
	redis  redis.UniversalClient
	mr     *miniredis.Miniredis
	prefix string // the Locker's key prefix
	cfg    idem.Config
}

var hybrids = []string{"hybrid", "hybrid-miniredis"}

func forEachHybrid(t *testing.T, fn func(t *testing.T, strategy string)) {
	for _, s := range hybrids {
		t.Run("strategy="+s, func(t *testing.T) { fn(t, s) })
	}
}

func newLeaseRig(t *testing.T, strategy string, cfg *idem.Config, dcfg *durable.Config) *leaseRig {
	t.Helper()
	r := &leaseRig{}
	r.store, _ = testdb.Store(t, dcfg)
	switch strategy {
	case "hybrid":
		r.redis = testredis.Client(t)
		r.prefix = testredis.Prefix(t, r.redis)
		// A generous timeout: these tests assert what Redis answers, and a
		// busy machine must not turn that into a fallback.
		l, err := lock.New(r.redis, &lock.Config{Prefix: r.prefix, Timeout: 5 * time.Second})
		require.NoError(t, err)
		r.locker = l
	case "hybrid-miniredis":
		r.mr = miniredis.RunT(t)
		r.redis = testredis.Miniredis(t, r.mr)
		l, err := lock.New(r.redis, &lock.Config{Timeout: 5 * time.Second}) // as above
		require.NoError(t, err)
		r.locker = l
	default:
		t.Fatalf("unknown strategy %q", strategy)
	}
	if cfg != nil {
		r.cfg = *cfg
	}
	r.cfg.Lock = r.locker
	if r.cfg.Logger == nil {
		r.cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	r.count = &countingStore{Store: r.store}
	g, err := idem.New(r.count, &r.cfg)
	require.NoError(t, err)
	r.guard = g
	return r
}

// do runs one request and reports how many times it asked the store for a
// row (claims and reads): a request that must not run makes no other call.
func (r *leaseRig) do(t *testing.T, rq idem.Request, work idem.Work) (idem.Response, idem.Outcome, int32, error) {
	t.Helper()
	before := r.count.calls.Load()
	resp, out, err := r.guard.Do(t.Context(), rq, work)
	return resp, out, r.count.calls.Load() - before, err
}

// rowAnswer is the answer the key's row holds, as a replay from PostgreSQL
// returns it.
func (r *leaseRig) rowAnswer(t *testing.T, rq idem.Request) idem.Response {
	t.Helper()
	rec, err := r.store.Get(t.Context(), rq.Scope, rq.Key)
	require.NoError(t, err)
	require.NotNil(t, rec.Answer, "the row has an answer")
	return *rec.Answer
}

// forget drops the key's lease, as a Redis failover or an expired copy does.
func (r *leaseRig) forget(t *testing.T, rq idem.Request) {
	t.Helper()
	require.NoError(t, r.locker.Delete(t.Context(), rq.Scope, rq.Key))
}

// leaseTTL is the remaining life of the key's lease in Redis, read after a
// round trip through the guard's Locker, so that the copies the guard queued
// before (Locker.Set does not wait) have reached Redis.
func (r *leaseRig) leaseTTL(t *testing.T, rq idem.Request) time.Duration {
	t.Helper()
	require.NoError(t, r.locker.Delete(t.Context(), "sync", newKey()))
	ttl, err := r.redis.PTTL(t.Context(), r.locker.Key(rq.Scope, rq.Key)).Result()
	require.NoError(t, err)
	return ttl
}

func mustNotRun(t *testing.T) idem.Work {
	return func(context.Context) (idem.Response, error) {
		t.Error("the work ran for a request that must not run")
		return idem.Response{Status: 500}, nil
	}
}

// A request in progress, a reused key and a replay are answered from the
// lease, with no PostgreSQL statement, and a replay from the copy is the same
// value as the row's answer.
func TestLeaseAnswersDuplicatesWithoutPostgres(t *testing.T) {
	forEachHybrid(t, func(t *testing.T, strategy string) {
		r := newLeaseRig(t, strategy, nil, nil)
		rq := req("user-1", newKey(), `{"sku":1}`)
		reused := req("user-1", rq.Key, `{"sku":2}`)

		started, finish := make(chan struct{}), make(chan struct{})
		done := make(chan struct{})
		answer := created("o-1")
		answer.Header.Add("Set-Cookie", "a=1")
		answer.Header.Add("Set-Cookie", "b=2")
		answer.Header["X-Raw-Case"] = []string{"kept as sent"}
		go func() {
			defer close(done)
			_, out, err := r.guard.Do(context.Background(), rq, func(context.Context) (idem.Response, error) {
				close(started)
				<-finish
				return answer, nil
			})
			if err != nil || out != idem.OutcomeExecuted {
				t.Errorf("first execution: %v %v", out, err)
			}
		}()
		<-started

		_, out, calls, err := r.do(t, rq, mustNotRun(t))
		require.Equal(t, idem.OutcomeInProgress, out)
		require.ErrorIs(t, err, idem.ErrInProgress)
		require.NotErrorIs(t, err, idem.ErrPending)
		require.Zero(t, calls, "a retry of a running request costs PostgreSQL nothing")

		close(finish)
		<-done

		want := r.rowAnswer(t, rq)
		for range 3 {
			resp, out, calls, err := r.do(t, rq, mustNotRun(t))
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeReplayed, out)
			require.Equal(t, want, resp, "the copy replays exactly the row's answer")
			require.Zero(t, calls, "a replay costs PostgreSQL nothing")
		}

		_, out, calls, err = r.do(t, reused, mustNotRun(t))
		require.Equal(t, idem.OutcomeKeyReused, out)
		require.ErrorIs(t, err, idem.ErrKeyReused)
		require.Zero(t, calls, "a reused key costs PostgreSQL nothing")

		ttl := r.leaseTTL(t, rq)
		require.Greater(t, ttl, time.Duration(0))
		require.LessOrEqual(t, ttl, 10*time.Minute)
		require.GreaterOrEqual(t, r.guard.Stats().LeaseAnswers, uint64(5))
	})
}

// A lease holder whose claim finds a row replaces the lease with what the row
// says, so that no later request is answered for another request's row: a
// key whose lease was lost (a failover, an expired copy) and whose row is
// answered, in progress or pending.
func TestLeaseTakesTheRowsState(t *testing.T) {
	forEachHybrid(t, func(t *testing.T, strategy string) {
		t.Run("answered row, reused key first", func(t *testing.T) {
			r := newLeaseRig(t, strategy, nil, nil)
			rq := req("user-1", newKey(), `{"sku":1}`)
			var c counter
			c.resp = created("o-2")
			_, out, err := r.guard.Do(t.Context(), rq, c.work)
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeExecuted, out)
			r.forget(t, rq)

			// A client bug gets the lease, and loses the claim.
			_, out, _, err = r.do(t, req("user-1", rq.Key, `{"sku":2}`), mustNotRun(t))
			require.Equal(t, idem.OutcomeKeyReused, out)
			require.ErrorIs(t, err, idem.ErrKeyReused)

			// The lease now holds the row's answer, not the loser's state.
			resp, out, calls, err := r.do(t, rq, mustNotRun(t))
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeReplayed, out)
			require.Equal(t, r.rowAnswer(t, rq), resp)
			require.Zero(t, calls)
			require.EqualValues(t, 1, c.n.Load())
		})

		t.Run("answered row, replay first", func(t *testing.T) {
			r := newLeaseRig(t, strategy, nil, nil)
			rq := req("user-1", newKey(), `{"sku":1}`)
			var c counter
			c.resp = idem.Response{Status: http.StatusPaymentRequired, Body: []byte(`{"error":"card_declined"}`)}
			_, _, err := r.guard.Do(t.Context(), rq, c.work)
			require.NoError(t, err)
			r.forget(t, rq)

			resp, out, calls, err := r.do(t, rq, mustNotRun(t))
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeReplayed, out)
			require.Equal(t, 1, int(calls), "the claim returns the answered row")
			require.Equal(t, r.rowAnswer(t, rq), resp)

			resp, out, calls, err = r.do(t, rq, mustNotRun(t))
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeReplayed, out)
			require.Equal(t, r.rowAnswer(t, rq), resp)
			require.Zero(t, calls, "the copy is back")
		})

		t.Run("row in progress under another instance", func(t *testing.T) {
			r := newLeaseRig(t, strategy, nil, nil)
			rq := req("user-1", newKey(), `{"sku":1}`)
			// A table-strategy instance runs it: a row, no lease.
			_, claimed, err := r.store.Claim(t.Context(), idem.ClaimParams{
				Scope: rq.Scope, Key: rq.Key, Fingerprint: rq.Fingerprint, Owner: idem.Token{7}})
			require.NoError(t, err)
			require.True(t, claimed)

			// A client bug gets the lease and loses: 422, and the lease says
			// the row runs under the row's fingerprint, not the bug's.
			_, out, _, _ := r.do(t, req("user-1", rq.Key, `{"sku":2}`), mustNotRun(t))
			require.Equal(t, idem.OutcomeKeyReused, out)

			_, out, calls, err := r.do(t, rq, mustNotRun(t))
			require.Equal(t, idem.OutcomeInProgress, out)
			require.ErrorIs(t, err, idem.ErrInProgress)
			require.Zero(t, calls)

			_, out, calls, err = r.do(t, req("user-1", rq.Key, `{"sku":3}`), mustNotRun(t))
			require.Equal(t, idem.OutcomeKeyReused, out)
			require.ErrorIs(t, err, idem.ErrKeyReused)
			require.Zero(t, calls, "the lease was read from the row: 422 without PostgreSQL")
		})

		t.Run("row pending reconciliation", func(t *testing.T) {
			r := newLeaseRig(t, strategy, nil, nil)
			rq := req("user-1", newKey(), `{"sku":1}`)
			_, out, _ := r.guard.Do(t.Context(), rq, func(context.Context) (idem.Response, error) {
				return idem.Response{Status: http.StatusGatewayTimeout}, nil
			})
			require.Equal(t, idem.OutcomeExecutedUnstored, out)
			ageRow(t, r.store, rq, r.guard.MaxHold()+time.Minute)
			r.forget(t, rq)

			_, out, calls, err := r.do(t, rq, mustNotRun(t))
			require.Equal(t, idem.OutcomeInProgress, out)
			require.ErrorIs(t, err, idem.ErrPending)
			require.Equal(t, 1, int(calls))

			_, out, calls, err = r.do(t, rq, mustNotRun(t))
			require.Equal(t, idem.OutcomeInProgress, out)
			require.ErrorIs(t, err, idem.ErrPending, "the lease says pending, as the row does")
			require.Zero(t, calls)
		})
	})
}

// ageRow moves the key's created_at into the past on the database's clock.
func ageRow(t *testing.T, s *durable.Store, rq idem.Request, by time.Duration) {
	t.Helper()
	db := testdb.Pool(t)
	tag, err := db.Exec(t.Context(),
		`UPDATE `+s.Table()+` SET created_at = created_at - $3::bigint * interval '1 microsecond',
			hold_until = hold_until - $3::bigint * interval '1 microsecond',
			completed_at = completed_at - $3::bigint * interval '1 microsecond'
		WHERE user_id = $1 AND key = $2`,
		rq.Scope, rq.Key, by.Microseconds())
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
}

// Released keys lose their lease, settled keys get the answer's copy: the
// lease never refuses a key the row would run, nor misses a settled answer.
func TestLeaseFollowsReleaseAndSettle(t *testing.T) {
	forEachHybrid(t, func(t *testing.T, strategy string) {
		t.Run("released by its execution", func(t *testing.T) {
			r := newLeaseRig(t, strategy, nil, nil)
			rq := req("user-1", newKey(), `{"sku":1}`)
			_, out, err := r.guard.Do(t.Context(), rq, func(context.Context) (idem.Response, error) {
				return idem.Response{Status: http.StatusServiceUnavailable}, idem.ErrRetrySafe
			})
			require.ErrorIs(t, err, idem.ErrRetrySafe)
			require.Equal(t, idem.OutcomeExecutedReleased, out)

			var c counter
			c.resp = created("o-3")
			_, out, err = r.guard.Do(t.Context(), rq, c.work)
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeExecuted, out, "the retry runs at once, not refused from a stale lease")
		})

		t.Run("released and settled by hand", func(t *testing.T) {
			r := newLeaseRig(t, strategy, nil, nil)
			rq := req("user-1", newKey(), `{"sku":1}`)
			fail := func(context.Context) (idem.Response, error) {
				return idem.Response{Status: http.StatusBadGateway}, nil
			}
			_, out, _ := r.guard.Do(t.Context(), rq, fail)
			require.Equal(t, idem.OutcomeExecutedUnstored, out)
			rec, err := r.store.Get(t.Context(), rq.Scope, rq.Key)
			require.NoError(t, err)
			require.NoError(t, r.guard.Release(t.Context(), rq.Scope, rq.Key, rec.Owner))

			_, out, _ = r.guard.Do(t.Context(), rq, fail)
			require.Equal(t, idem.OutcomeExecutedUnstored, out, "a released key runs again")
			rec, err = r.store.Get(t.Context(), rq.Scope, rq.Key)
			require.NoError(t, err)
			settled := created("o-4")
			require.NoError(t, r.guard.Settle(t.Context(), rq.Scope, rq.Key, rec.Owner, settled))

			resp, out, calls, err := r.do(t, rq, mustNotRun(t))
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeReplayed, out)
			require.Equal(t, r.rowAnswer(t, rq), resp)
			require.Zero(t, calls, "the settled answer is copied to the lease")
		})
	})
}

// The copy never outlives the key: its TTL is at most the key's remaining
// retention as PostgreSQL counts it, so an expired key's new intent never
// meets the old answer.
func TestLeaseCopyNeverOutlivesTheKey(t *testing.T) {
	r := newLeaseRig(t, "hybrid-miniredis",
		&idem.Config{WorkTimeout: 100 * time.Millisecond, StoreTimeout: time.Second},
		&durable.Config{Retention: 10 * time.Second})
	rq := req("user-1", newKey(), `{"sku":1}`)
	var c counter
	c.resp = created("o-5")
	_, out, err := r.guard.Do(t.Context(), rq, c.work)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out)
	ttl := r.leaseTTL(t, rq)
	require.Greater(t, ttl, time.Duration(0))
	require.LessOrEqual(t, ttl, 10*time.Second, "the copy lives no longer than the key")

	// The key expires in PostgreSQL; Redis has counted the copy down too.
	ageRow(t, r.store, rq, 11*time.Second)
	r.mr.FastForward(ttl)
	c.resp = created("o-6")
	resp, out, err := r.guard.Do(t.Context(), rq, c.work)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out, "an expired key is a new intent")
	require.Equal(t, created("o-6").Body, resp.Body)
	require.EqualValues(t, 2, c.n.Load())
}

// A Redis failover between the lease and the copy (the new master has
// neither) lets a retry take the lease: its claim loses to the running row,
// so the work still runs once, and the copy written after the answer wins.
func TestLeaseFailoverMidExecution(t *testing.T) {
	forEachHybrid(t, func(t *testing.T, strategy string) {
		r := newLeaseRig(t, strategy, nil, nil)
		rq := req("user-1", newKey(), `{"sku":1}`)
		started, finish := make(chan struct{}), make(chan struct{})
		var runs atomic.Int32
		var wg sync.WaitGroup
		wg.Go(func() {
			_, out, err := r.guard.Do(context.Background(), rq, func(context.Context) (idem.Response, error) {
				runs.Add(1)
				close(started)
				<-finish
				return created("o-7"), nil
			})
			if err != nil || out != idem.OutcomeExecuted {
				t.Errorf("first execution: %v %v", out, err)
			}
		})
		<-started
		r.forget(t, rq) // the failover

		_, out, err := r.guard.Do(t.Context(), rq, mustNotRun(t))
		require.Equal(t, idem.OutcomeInProgress, out)
		require.ErrorIs(t, err, idem.ErrInProgress)
		close(finish)
		wg.Wait()

		resp, out, calls, err := r.do(t, rq, mustNotRun(t))
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeReplayed, out)
		require.Equal(t, r.rowAnswer(t, rq), resp)
		require.Zero(t, calls)
		require.EqualValues(t, 1, runs.Load())
	})
}

// copyGate is a go-redis hook that holds every answer copy (a SET without
// NX) until released, so that a test can act while a copy is in flight.
type copyGate struct {
	held    chan struct{} // receives when a copy is held
	release chan struct{}
}

func newCopyGate() *copyGate {
	return &copyGate{held: make(chan struct{}, 16), release: make(chan struct{})}
}

// setOptions reports whether cmd is a SET and whether it asks NX and GET:
// the lock's obtain is SET ... NX GET, an answer's copy a SET without NX.
func setOptions(cmd redis.Cmder) (set, nx, get bool) {
	args := cmd.Args()
	if name, _ := args[0].(string); !strings.EqualFold(name, "set") || len(args) < 3 {
		return false, false, false
	}
	for _, a := range args[3:] {
		opt, _ := a.(string)
		nx = nx || strings.EqualFold(opt, "nx")
		get = get || strings.EqualFold(opt, "get")
	}
	return true, nx, get
}

func (g *copyGate) hold(cmds []redis.Cmder) {
	for _, cmd := range cmds {
		if set, nx, _ := setOptions(cmd); !set || nx {
			continue
		}
		g.held <- struct{}{}
		<-g.release
		return
	}
}

func (g *copyGate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *copyGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		g.hold([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (g *copyGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		g.hold(cmds)
		return next(ctx, cmds)
	}
}

// The request does not wait for its answer's copy. Another instance's retry
// that reaches Redis while the copy is in flight finds the first request's
// state and is refused (409), never run and never answered otherwise than the
// row; once the copy has landed, both instances replay it without
// PostgreSQL.
func TestLeaseCopyInFlight(t *testing.T) {
	a := newLeaseRig(t, "hybrid-miniredis", nil, nil)
	gate := newCopyGate()
	a.redis.AddHook(gate)
	other, err := lock.New(testredis.Miniredis(t, a.mr), &lock.Config{Timeout: 5 * time.Second})
	require.NoError(t, err)
	count := &countingStore{Store: a.store}
	b, err := idem.New(count, &idem.Config{Lock: other, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	rq := req("user-1", newKey(), `{"sku":1}`)

	var c counter
	c.resp = created("o-10")
	_, out, err := a.guard.Do(t.Context(), rq, c.work) // returns with its copy held
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out)
	<-gate.held

	_, out, err = b.Do(t.Context(), rq, mustNotRun(t))
	require.Equal(t, idem.OutcomeInProgress, out, "the copy is in flight: refused, not run")
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.Zero(t, count.calls.Load(), "refused by Redis")

	close(gate.release)
	want := a.rowAnswer(t, rq)
	resp, out, calls, err := a.do(t, rq, mustNotRun(t))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out)
	require.Equal(t, want, resp)
	require.Zero(t, calls)
	resp, out, err = b.Do(t.Context(), rq, mustNotRun(t)) // after a's command, so after its copy
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out)
	require.Equal(t, want, resp)
	require.Zero(t, count.calls.Load(), "replayed from the copy")
	require.EqualValues(t, 1, c.n.Load())
}

// failingCopies is a Locker whose writes after the lease are lost: the answer
// is committed, its copy never reaches Redis.
type failingCopies struct {
	idem.Locker
}

func (failingCopies) Set(_, _ string, _ []byte, _ time.Duration, answered func(error)) {
	answered(errors.New("connection reset by peer"))
}

// A lost copy leaves the lease saying "running": retries are refused, never
// answered otherwise than the row, and once that state is older than a few
// seconds they are checked against the row and replayed.
func TestLeaseCopyLost(t *testing.T) {
	mr := miniredis.RunT(t)
	l, err := lock.New(testredis.Miniredis(t, mr), nil)
	require.NoError(t, err)
	store, _ := testdb.Store(t, nil)
	g, err := idem.New(store, &idem.Config{Lock: failingCopies{l}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	rq := req("user-1", newKey(), `{"sku":1}`)
	var c counter
	c.resp = created("o-8")
	_, out, err := g.Do(t.Context(), rq, c.work)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out)

	// The lease still says "running" (or the guard, having seen Redis fail,
	// asks the row for a second): refused too long, never a wrong answer.
	resp, out, err := g.Do(t.Context(), rq, mustNotRun(t))
	if out == idem.OutcomeInProgress {
		require.ErrorIs(t, err, idem.ErrInProgress)
	} else {
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeReplayed, out)
		require.Equal(t, created("o-8").Body, resp.Body)
	}

	mr.FastForward(6 * time.Second) // less than the lease's TTL
	resp, out, err = g.Do(t.Context(), rq, mustNotRun(t))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out)
	require.Equal(t, created("o-8").Body, resp.Body)
	require.EqualValues(t, 1, c.n.Load())
}

// A fleet mixing both strategies on one table: table instances write no
// lease, yet a hybrid instance never replays an answer other than the row's,
// and refuses a key a table instance answered only until its lease expires.
func TestLeaseMixedFleet(t *testing.T) {
	r := newLeaseRig(t, "hybrid-miniredis", nil, nil)
	table, err := idem.New(r.store, &idem.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	rq := req("user-1", newKey(), `{"sku":1}`)

	started, finish := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		_, out, err := table.Do(context.Background(), rq, func(context.Context) (idem.Response, error) {
			close(started)
			<-finish
			return created("o-9"), nil
		})
		if err != nil || out != idem.OutcomeExecuted {
			t.Errorf("table instance: %v %v", out, err)
		}
	})
	<-started
	_, out, err := r.guard.Do(t.Context(), rq, mustNotRun(t))
	require.Equal(t, idem.OutcomeInProgress, out)
	require.ErrorIs(t, err, idem.ErrInProgress)
	close(finish)
	wg.Wait()

	// The table instance answered without telling Redis: the hybrid refuses
	// until the state it read from the row is a few seconds old, then reads
	// the row, replays it and copies it to the lease.
	_, out, _ = r.guard.Do(t.Context(), rq, mustNotRun(t))
	require.Equal(t, idem.OutcomeInProgress, out)
	r.mr.FastForward(6 * time.Second)
	resp, out, err := r.guard.Do(t.Context(), rq, mustNotRun(t))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out)
	require.Equal(t, r.rowAnswer(t, rq), resp)
	resp, out, calls, err := r.do(t, rq, mustNotRun(t))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out)
	require.Equal(t, r.rowAnswer(t, rq), resp)
	require.Zero(t, calls)
}

// stalledLocker is a lease service that never answers in time.
type stalledLocker struct {
	calls atomic.Int32
}

func (s *stalledLocker) TryLock(ctx context.Context, _, _ string, _ []byte) ([]byte, time.Duration, func(context.Context, []byte, time.Duration) error, error) {
	s.calls.Add(1)
	return nil, 0, nil, errors.New("i/o timeout")
}

func (s *stalledLocker) Set(_, _ string, _ []byte, _ time.Duration, answered func(error)) {
	s.calls.Add(1)
	answered(errors.New("i/o timeout"))
}

func (s *stalledLocker) Delete(context.Context, string, string) error {
	s.calls.Add(1)
	return errors.New("i/o timeout")
}

func (s *stalledLocker) Shutdown(context.Context) error { return nil }

// Once Redis has failed, the hybrid stops asking it for a while: the requests
// that follow go straight to the table claim, and each still runs once.
func TestLeaseServiceFailureIsRememberedBriefly(t *testing.T) {
	store, _ := testdb.Store(t, nil)
	var sl stalledLocker
	g, err := idem.New(store, &idem.Config{Lock: &sl, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	start := time.Now()
	for i := range 5 {
		var c counter
		c.resp = created("o")
		_, out, err := g.Do(t.Context(), req("user-1", newKey(), "b"), c.work)
		require.NoError(t, err, i)
		require.Equal(t, idem.OutcomeExecuted, out)
		require.EqualValues(t, 1, c.n.Load())
	}
	// One probe per second at most after the first failure.
	require.LessOrEqual(t, int(sl.calls.Load()), 1+int(time.Since(start)/time.Second),
		"the requests after a failure do not ask the failed service")
	require.EqualValues(t, 5, g.Stats().Fallbacks)
}
