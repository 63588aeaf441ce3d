package idem_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/testdb"
	"github.com/idemguard/idem/internal/testredis"
	"github.com/idemguard/idem/lock"
)

// Strategies every behavioural test runs under: the table strategy, the
// hybrid on a real Redis (leasing first, as a new Guard does), the hybrid
// on miniredis, and the hybrid on a real Redis claiming first for good (as
// it does while duplicates are rare).
var strategies = []string{"table", "hybrid", "hybrid-miniredis", "hybrid-claim-first"}

// bundle is what a stateful test needs.
type bundle struct {
	guard  *idem.Guard
	store  *durable.Store
	pool   *pgxpool.Pool
	mr     *miniredis.Miniredis // set for hybrid-miniredis
	redis  redis.UniversalClient
	locker *lock.Locker // set for the hybrids
}

// forgetLease deletes the key's lease in the hybrids, as its expiry would:
// for a test that moves the row's clock, which the lease does not follow.
func (b bundle) forgetLease(t *testing.T, scope, key string) {
	t.Helper()
	if b.locker != nil {
		require.NoError(t, b.locker.Delete(t.Context(), scope, key))
	}
}

type setupOpts struct {
	cfg    idem.Config
	store  func(idem.Store) idem.Store   // wraps the store, for fault injection
	wait   bool                          // the store announces answers; a Listener is the Guard's Waiter
	waiter func(idem.Waiter) idem.Waiter // wraps the Listener
}

func setup(t *testing.T, strategy string, opts ...func(*setupOpts)) bundle {
	t.Helper()
	var o setupOpts
	for _, f := range opts {
		f(&o)
	}
	store, pool := testdb.Store(t, &durable.Config{Notify: o.wait})
	b := bundle{store: store, pool: pool}
	if o.wait {
		l, err := durable.NewListener(t.Context(), store)
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close() })
		o.cfg.Waiter = l
		if o.waiter != nil {
			o.cfg.Waiter = o.waiter(l)
		}
	}
	switch strategy {
	case "table":
	case "hybrid", "hybrid-claim-first":
		c := testredis.Client(t)
		l, err := lock.New(c, &lock.Config{Prefix: testredis.Prefix(t, c)})
		require.NoError(t, err)
		o.cfg.Lock, b.redis, b.locker = l, c, l
	case "hybrid-miniredis":
		b.mr = miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: b.mr.Addr(), MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		l, err := lock.New(c, nil)
		require.NoError(t, err)
		o.cfg.Lock, b.redis, b.locker = l, c, l
	default:
		t.Fatalf("unknown strategy %q", strategy)
	}
	if o.cfg.Logger == nil {
		o.cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	var s idem.Store = store
	if o.store != nil {
		s = o.store(store)
	}
	g, err := idem.New(s, &o.cfg)
	require.NoError(t, err)
	if strategy == "hybrid-claim-first" {
		idem.PinClaimFirst(g)
	}
	b.guard = g
	return b
}

func forEachStrategy(t *testing.T, fn func(t *testing.T, strategy string)) {
	for _, s := range strategies {
		t.Run("strategy="+s, func(t *testing.T) { fn(t, s) })
	}
}

func newKey() string { return "key-" + rand.Text() }

// ownerOf returns the owner token of the key's current attempt, which
// Settle and Release check.
func ownerOf(t *testing.T, s interface {
	Get(context.Context, string, string) (idem.Record, error)
}, scope, key string) idem.Token {
	t.Helper()
	rec, err := s.Get(context.Background(), scope, key)
	require.NoError(t, err)
	return rec.Owner
}

func req(scope, key, body string) idem.Request {
	return idem.Request{Scope: scope, Key: key, Fingerprint: idem.HashRequest("POST", "/orders", []byte(body))}
}

// counter is a Work that counts its executions and answers resp.
type counter struct {
	n    atomic.Int32
	resp idem.Response
	err  error
}

func (c *counter) work(ctx context.Context) (idem.Response, error) {
	c.n.Add(1)
	return c.resp, c.err
}

func created(id string) idem.Response {
	return idem.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Location": {"/orders/" + id}, "Content-Type": {"application/json"}},
		Body:   []byte(`{"id":"` + id + `"}`),
	}
}

func TestExecutesOnceAndReplays(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		b := setup(t, strategy)
		ctx := context.Background()
		w := &counter{resp: created("o1")}
		r := req("user-1", newKey(), `{"hold_ids":[1]}`)

		resp, out, err := b.guard.Do(ctx, r, w.work)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out)
		require.Equal(t, w.resp, resp)

		for range 3 {
			resp, out, err = b.guard.Do(ctx, r, w.work)
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeReplayed, out)
			require.Equal(t, w.resp.Status, resp.Status)
			require.Equal(t, w.resp.Header, resp.Header)
			require.Equal(t, w.resp.Body, resp.Body)
		}
		require.EqualValues(t, 1, w.n.Load())
		st := b.guard.Stats()
		require.EqualValues(t, 1, st.Executed)
		require.EqualValues(t, 3, st.Replayed)
	})
}

func TestDeclinedIsAnAnswer(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		b := setup(t, strategy)
		w := &counter{resp: idem.Response{Status: http.StatusPaymentRequired, Body: []byte("card declined")}}
		r := req("u", newKey(), "b")
		_, out, err := b.guard.Do(context.Background(), r, w.work)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out)
		resp, out, err := b.guard.Do(context.Background(), r, w.work)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeReplayed, out)
		require.Equal(t, http.StatusPaymentRequired, resp.Status)
		require.Equal(t, "card declined", string(resp.Body))
		require.EqualValues(t, 1, w.n.Load())
	})
}

func TestScopeIsolation(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		b := setup(t, strategy)
		w := &counter{resp: created("x")}
		key := newKey()
		for _, scope := range []string{"alice", "bob"} {
			_, out, err := b.guard.Do(context.Background(), req(scope, key, "same"), w.work)
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeExecuted, out, scope)
		}
		require.EqualValues(t, 2, w.n.Load())
	})
}

func TestKeyReused(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		b := setup(t, strategy)
		ctx := context.Background()
		key := newKey()
		w := &counter{resp: created("o1")}
		_, _, err := b.guard.Do(ctx, req("u", key, "first"), w.work)
		require.NoError(t, err)

		resp, out, err := b.guard.Do(ctx, req("u", key, "second"), w.work)
		require.ErrorIs(t, err, idem.ErrKeyReused)
		require.Equal(t, idem.OutcomeKeyReused, out)
		require.Zero(t, resp.Status, "the stored answer must not leak to a different request")
		require.EqualValues(t, 1, w.n.Load())

		// A mismatch wins over "in progress" too.
		key2 := newKey()
		pending := &counter{resp: idem.Response{Status: http.StatusGatewayTimeout}}
		_, out, _ = b.guard.Do(ctx, req("u", key2, "first"), pending.work)
		require.Equal(t, idem.OutcomeExecutedUnstored, out)
		_, out, err = b.guard.Do(ctx, req("u", key2, "second"), pending.work)
		require.ErrorIs(t, err, idem.ErrKeyReused)
		require.Equal(t, idem.OutcomeKeyReused, out)
	})
}

// A request arriving while the first runs gets ErrInProgress, in both
// strategies, and the first one's answer is replayed afterwards.
func TestInProgressWhileRunning(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		b := setup(t, strategy)
		ctx := context.Background()
		r := req("u", newKey(), "body")
		started, finish := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, _, err := b.guard.Do(ctx, r, func(context.Context) (idem.Response, error) {
				close(started)
				<-finish
				return created("slow"), nil
			})
			done <- err
		}()
		<-started
		var ran atomic.Bool
		_, out, err := b.guard.Do(ctx, r, func(context.Context) (idem.Response, error) {
			ran.Store(true)
			return idem.Response{Status: 200}, nil
		})
		require.ErrorIs(t, err, idem.ErrInProgress)
		require.Equal(t, idem.OutcomeInProgress, out)
		require.False(t, ran.Load())
		close(finish)
		require.NoError(t, <-done)

		resp, out, err := b.guard.Do(ctx, r, nil2xx(t))
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeReplayed, out)
		require.Equal(t, "/orders/slow", resp.Header.Get("Location"))
	})
}

// nil2xx is a Work that fails the test if it runs.
func nil2xx(t *testing.T) idem.Work {
	return func(context.Context) (idem.Response, error) {
		t.Error("work ran but must not")
		return idem.Response{Status: 200}, nil
	}
}

// 64 goroutines, one key: exactly one execution; everybody else is told
// "in progress" or replayed the one answer.
func TestRaceExactlyOnce(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		b := setup(t, strategy)
		raceOneKey(t, b.guard, req("racer", newKey(), `{"hold_ids":[88211]}`))
	})
}

// raceRequests is how many goroutines raceOneKey sends at once.
const raceRequests = 64

// raceOneKey sends r through g from raceRequests goroutines at once, with a
// work that holds its claim for 20ms, and requires exactly one execution:
// every other request is told "in progress" or replayed the one answer.
func raceOneKey(t *testing.T, g *idem.Guard, r idem.Request, msgAndArgs ...any) {
	t.Helper()
	const n = raceRequests
	var executions atomic.Int32
	outcomes := make([]idem.Outcome, n)
	bodies := make([]string, n)
	errs := make([]error, n) // checked after Wait: require may not run in a goroutine
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			resp, out, err := g.Do(context.Background(), r, func(context.Context) (idem.Response, error) {
				executions.Add(1)
				time.Sleep(20 * time.Millisecond) // hold the claim while others arrive
				return created(fmt.Sprint("winner-", i)), nil
			})
			outcomes[i], bodies[i], errs[i] = out, string(resp.Body), err
		})
	}
	close(start)
	wg.Wait()
	// A request refused at admission (no pool connection free in time: a
	// 503, nothing ran) is an answer too; the guarantee is about the rest.
	refused := 0
	for i, err := range errs {
		switch {
		case outcomes[i] == idem.OutcomeNone && errors.Is(err, idem.ErrUnavailable):
			refused++
		case outcomes[i] != idem.OutcomeInProgress:
			require.NoError(t, err, "goroutine %d", i)
		}
	}
	require.Less(t, refused, n, "every request was refused: nothing raced")
	require.EqualValues(t, 1, executions.Load(), msgAndArgs...)
	var executed int
	var answer string
	for i, o := range outcomes {
		switch o {
		case idem.OutcomeExecuted:
			executed++
			answer = bodies[i]
		case idem.OutcomeInProgress, idem.OutcomeReplayed:
		case idem.OutcomeNone:
			require.ErrorIs(t, errs[i], idem.ErrUnavailable, "goroutine %d", i)
		default:
			t.Fatalf("goroutine %d: unexpected outcome %v", i, o)
		}
	}
	require.Equal(t, 1, executed, msgAndArgs...)
	for i, o := range outcomes {
		if o == idem.OutcomeReplayed {
			require.Equal(t, answer, bodies[i], msgAndArgs...)
		}
	}
}

// A 5xx is never stored: the key stays in progress (also after the hybrid's
// lease is gone) until Settle stores the real answer or Release frees it.
func TestServerErrorLeavesKeyInProgress(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		b := setup(t, strategy)
		ctx := context.Background()
		r := req("u", newKey(), "pay")
		w := &counter{resp: idem.Response{Status: http.StatusGatewayTimeout, Body: []byte("timeout")}}
		resp, out, err := b.guard.Do(ctx, r, w.work)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecutedUnstored, out)
		require.Equal(t, http.StatusGatewayTimeout, resp.Status, "the caller still gets its own answer")

		for range 2 {
			_, out, err = b.guard.Do(ctx, r, w.work)
			require.ErrorIs(t, err, idem.ErrInProgress)
			require.Equal(t, idem.OutcomeInProgress, out)
		}
		require.EqualValues(t, 1, w.n.Load())

		intent := ownerOf(t, b.store, r.Scope, r.Key)
		require.NoError(t, b.guard.Settle(ctx, r.Scope, r.Key, intent, created("settled")))
		require.NoError(t, b.guard.Settle(ctx, r.Scope, r.Key, intent, created("settled")), "the same answer again")
		resp, out, err = b.guard.Do(ctx, r, w.work)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeReplayed, out)
		require.Equal(t, http.StatusCreated, resp.Status)
		require.ErrorIs(t, b.guard.Settle(ctx, r.Scope, r.Key, intent, created("again")), idem.ErrCompleted)
		require.ErrorIs(t, b.guard.Release(ctx, r.Scope, r.Key, intent), idem.ErrCompleted)

		// Release: "nothing happened", the next retry runs.
		r2 := req("u", newKey(), "pay")
		_, _, _ = b.guard.Do(ctx, r2, w.work)
		require.NoError(t, b.guard.Release(ctx, r2.Scope, r2.Key, ownerOf(t, b.store, r2.Scope, r2.Key)))
		ok := &counter{resp: created("after-release")}
		_, out, err = b.guard.Do(ctx, r2, ok.work)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out)
		require.EqualValues(t, 1, ok.n.Load())

		require.ErrorContains(t, b.guard.Settle(ctx, "u", newKey(), intent, idem.Response{Status: 503}), "cannot be stored")
		require.ErrorIs(t, b.guard.Settle(ctx, "u", newKey(), intent, created("x")), idem.ErrNotFound)
		require.ErrorIs(t, b.guard.Release(ctx, "u", newKey(), intent), idem.ErrNotFound)
	})
}

func TestWorkErrorLeavesKeyInProgress(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		b := setup(t, strategy)
		boom := errors.New("provider said something odd")
		w := &counter{err: boom}
		r := req("u", newKey(), "x")
		_, out, err := b.guard.Do(context.Background(), r, w.work)
		require.ErrorIs(t, err, boom)
		require.Equal(t, idem.OutcomeExecutedUnstored, out)
		_, _, err = b.guard.Do(context.Background(), r, w.work)
		require.ErrorIs(t, err, idem.ErrInProgress)
		require.EqualValues(t, 1, w.n.Load())
	})
}

// 429, ErrRetrySafe and MarkRetrySafe release the key: the next retry runs.
func TestRetrySafeReleasesKey(t *testing.T) {
	cases := map[string]idem.Work{
		"429": func(context.Context) (idem.Response, error) {
			return idem.Response{Status: http.StatusTooManyRequests}, nil
		},
		"ErrRetrySafe": func(context.Context) (idem.Response, error) {
			return idem.Response{}, fmt.Errorf("breaker open: %w", idem.ErrRetrySafe)
		},
		"MarkRetrySafe": func(ctx context.Context) (idem.Response, error) {
			if !idem.MarkRetrySafe(ctx) {
				return idem.Response{}, errors.New("not a guarded context")
			}
			return idem.Response{Status: http.StatusServiceUnavailable}, nil
		},
	}
	forEachStrategy(t, func(t *testing.T, strategy string) {
		b := setup(t, strategy)
		for name, first := range cases {
			t.Run(name, func(t *testing.T) {
				r := req("u", newKey(), name)
				_, out, _ := b.guard.Do(context.Background(), r, first)
				require.Equal(t, idem.OutcomeExecutedReleased, out)
				w := &counter{resp: created(name)}
				_, out, err := b.guard.Do(context.Background(), r, w.work)
				require.NoError(t, err)
				require.Equal(t, idem.OutcomeExecuted, out)
				require.EqualValues(t, 1, w.n.Load())
			})
		}
	})
	require.False(t, idem.MarkRetrySafe(context.Background()))
}

// A panic may come after a side effect: the key stays in progress and the
// panic continues. Only a work that said MarkRetrySafe first gets its key
// released.
func TestPanicLeavesKeyInProgress(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		b := setup(t, strategy)
		r := req("u", newKey(), "x")
		require.PanicsWithValue(t, "handler bug", func() {
			_, _, _ = b.guard.Do(context.Background(), r, func(context.Context) (idem.Response, error) {
				panic("handler bug") // after the charge, say
			})
		})
		_, out, err := b.guard.Do(context.Background(), r, nil2xx(t))
		require.ErrorIs(t, err, idem.ErrInProgress)
		require.Equal(t, idem.OutcomeInProgress, out)
		require.EqualValues(t, 1, b.guard.Stats().Unstored)

		safe := req("u", newKey(), "y")
		require.PanicsWithValue(t, "bug before any effect", func() {
			_, _, _ = b.guard.Do(context.Background(), safe, func(ctx context.Context) (idem.Response, error) {
				idem.MarkRetrySafe(ctx)
				panic("bug before any effect")
			})
		})
		w := &counter{resp: created("after-panic")}
		_, out, err = b.guard.Do(context.Background(), safe, w.work)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out)
	})
}

func TestInvalidRequest(t *testing.T) {
	b := setup(t, "table")
	fp := idem.HashRequest("POST", "/", nil)
	long := string(make([]byte, 256))
	for name, r := range map[string]idem.Request{
		"empty scope":   {Scope: "", Key: "k", Fingerprint: fp},
		"empty key":     {Scope: "u", Key: "", Fingerprint: fp},
		"long key":      {Scope: "u", Key: "k" + long[1:] + "k", Fingerprint: fp},
		"NUL in key":    {Scope: "u", Key: "a\x00b", Fingerprint: fp},
		"NUL in scope":  {Scope: "u\x00", Key: "k", Fingerprint: fp},
		"bad UTF-8 key": {Scope: "u", Key: "\xff\xfe", Fingerprint: fp},
		"zero print":    {Scope: "u", Key: "k"},
	} {
		t.Run(name, func(t *testing.T) {
			_, out, err := b.guard.Do(context.Background(), r, nil2xx(t))
			require.ErrorIs(t, err, idem.ErrInvalidRequest)
			var re *idem.RequestError
			require.ErrorAs(t, err, &re)
			require.NotEmpty(t, re.Field)
			require.Equal(t, idem.OutcomeNone, out)
		})
	}
}

// The caller hanging up during the work does not lose the answer.
func TestAnswerStoredAfterCallerCancels(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		b := setup(t, strategy)
		ctx, cancel := context.WithCancel(context.Background())
		r := req("u", newKey(), "x")
		_, out, err := b.guard.Do(ctx, r, func(context.Context) (idem.Response, error) {
			cancel()
			return created("kept"), nil
		})
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out)
		resp, out, err := b.guard.Do(context.Background(), r, nil2xx(t))
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeReplayed, out)
		require.Equal(t, "/orders/kept", resp.Header.Get("Location"))
	})
}

// An expired key (answered longer than the retention ago) is a new intent,
// even before any sweep: it runs again
// under a new intent token, so what it derives (an order id, a provider key) is
// new too.
func TestExpiredKeyIsNewIntent(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		b := setup(t, strategy)
		ctx := context.Background()
		r := req("u", newKey(), "x")
		var intents []idem.Token
		work := func(ctx context.Context) (idem.Response, error) {
			id := idem.ExecutionFromContext(ctx).Intent
			require.NotZero(t, id)
			intents = append(intents, id)
			return created(idem.DeriveID("ord_", "order", id)), nil
		}
		first, _, err := b.guard.Do(ctx, r, work)
		require.NoError(t, err)
		_, err = b.pool.Exec(ctx, "UPDATE "+b.store.Table()+" SET created_at = now() - interval '25 hours', completed_at = now() - interval '25 hours' WHERE key = $1", r.Key)
		require.NoError(t, err)
		// The copy of the first answer expired before the key did (its TTL
		// is at most the key's remaining retention).
		b.forgetLease(t, r.Scope, r.Key)
		second, out, err := b.guard.Do(ctx, r, work)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out)
		require.Len(t, intents, 2)
		require.NotEqual(t, intents[0], intents[1], "a new intent")
		require.NotEqual(t, first.Header.Get("Location"), second.Header.Get("Location"), "a new order, not the old one")

		rec, err := b.store.Get(ctx, r.Scope, r.Key)
		require.NoError(t, err)
		require.Equal(t, intents[1], rec.Intent, "the row names the intent")
	})
}

// The work's deadline is WorkTimeout after the claim, in both strategies; in
// hybrid mode it may outlive the lease, which is a filter, not the fence.
func TestWorkDeadline(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		b := setup(t, strategy)
		_, _, err := b.guard.Do(context.Background(), req("u", newKey(), "x"), func(ctx context.Context) (idem.Response, error) {
			dl, ok := ctx.Deadline()
			require.True(t, ok, "work must have a deadline")
			require.InDelta(t, float64(20*time.Second), float64(time.Until(dl)), float64(time.Second), "the default WorkTimeout")
			return created("x"), nil
		})
		require.NoError(t, err)
	})
	b := setup(t, "hybrid-miniredis")
	g, err := idem.New(b.store, &idem.Config{Lock: mustLocker(t, b.redis), WorkTimeout: time.Minute})
	require.NoError(t, err, "a WorkTimeout longer than the lease is allowed")
	require.Equal(t, time.Minute+time.Second+5*5*time.Second+500*time.Millisecond, g.MaxHold())
}

func mustLocker(t *testing.T, c redis.UniversalClient) *lock.Locker {
	l, err := lock.New(c, nil)
	require.NoError(t, err)
	return l
}

// A lease that expires (or vanishes with Redis) while the work runs lets a
// retry through the filter, not through the fence: the retry's claim finds
// the running row and answers 409, and the work runs once.
func TestHybridLeaseLostDuringWork(t *testing.T) {
	b := setup(t, "hybrid-miniredis")
	ctx := context.Background()
	r := req("u", newKey(), "y")
	w := &counter{resp: created("late")}
	var retry idem.Outcome
	resp, out, err := b.guard.Do(ctx, r, func(ctx context.Context) (idem.Response, error) {
		b.mr.FastForward(31 * time.Second) // the lease expires mid-work
		_, retry, _ = b.guard.Do(ctx, r, w.work)
		b.mr.FlushAll() // and Redis loses every key
		_, again, _ := b.guard.Do(ctx, r, w.work)
		require.Equal(t, idem.OutcomeInProgress, again)
		return created("first"), nil
	})
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out)
	require.Equal(t, idem.OutcomeInProgress, retry)
	require.Zero(t, w.n.Load(), "the retries never ran")
	replay, out, _ := b.guard.Do(ctx, r, nil2xx(t))
	require.Equal(t, idem.OutcomeReplayed, out)
	require.Equal(t, resp.Header.Get("Location"), replay.Header.Get("Location"))
	require.Zero(t, b.guard.Stats().DoubleExecutions)

	// A holder that crashed: its in-progress row answers 409 after its
	// lease is gone, until a reconciler settles it.
	r2 := req("u", newKey(), "x")
	_, out, _ = b.guard.Do(ctx, r2, (&counter{resp: idem.Response{Status: 504}}).work)
	require.Equal(t, idem.OutcomeExecutedUnstored, out)
	b.mr.FastForward(31 * time.Second)
	_, out, err = b.guard.Do(ctx, r2, nil2xx(t))
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.Equal(t, idem.OutcomeInProgress, out)
}

// A claim released by hand (or by a reconciler, for work that overran
// MaxHold) while the work ran is detected when the answer is written: the
// answer of the execution that holds the row now stays, and the double
// execution is counted and logged.
func TestTakenOverClaimIsDetected(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		b := setup(t, strategy)
		ctx := context.Background()
		r := req("u", newKey(), "x")
		_, out, err := b.guard.Do(ctx, r, func(ctx context.Context) (idem.Response, error) {
			require.NoError(t, b.guard.Release(ctx, r.Scope, r.Key, ownerOf(t, b.store, r.Scope, r.Key)))
			if b.mr != nil {
				b.mr.FlushAll()
			}
			_, out, err := b.guard.Do(ctx, r, (&counter{resp: created("second")}).work)
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeExecuted, out)
			return created("first"), nil
		})
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecutedUnstored, out)
		require.EqualValues(t, 1, b.guard.Stats().DoubleExecutions)
		resp, _, _ := b.guard.Do(ctx, r, nil2xx(t))
		require.Equal(t, "/orders/second", resp.Header.Get("Location"))
	})
}

// Two instances over one table, one on each strategy (a rolling deploy), or
// both hybrid with Redis reachable from only one of them (a partial
// partition): whichever claims first runs, the other answers 409 while it
// runs and replays after. Never twice.
func TestTwoInstancesNeverBothRun(t *testing.T) {
	for _, tc := range []struct{ name, first, second string }{
		{"hybrid-then-table", "hybrid", "table"},
		{"table-then-hybrid", "table", "hybrid"},
		{"partition/lease-holder-then-cut-off", "hybrid", "cut-off"},
		{"partition/cut-off-then-lease-holder", "cut-off", "hybrid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, _ := testdb.Store(t, nil)
			mr := miniredis.RunT(t)
			cutOff := miniredis.RunT(t) // the Redis the cut-off instance cannot reach
			cutOff.SetError("ERR unreachable")
			guard := func(kind string) *idem.Guard {
				cfg := &idem.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
				switch kind {
				case "hybrid":
					cfg.Lock = mustLocker(t, testredis.Miniredis(t, mr))
				case "cut-off":
					cfg.Lock = mustLocker(t, testredis.Miniredis(t, cutOff))
				}
				g, err := idem.New(store, cfg)
				require.NoError(t, err)
				return g
			}
			a, b := guard(tc.first), guard(tc.second)
			ctx := context.Background()
			r := req("u", newKey(), "x")
			var runs atomic.Int32
			work := func(id string) idem.Work {
				return func(context.Context) (idem.Response, error) { runs.Add(1); return created(id), nil }
			}
			resp, out, err := a.Do(ctx, r, func(ctx context.Context) (idem.Response, error) {
				_, out, err := b.Do(ctx, r, work("B"))
				require.ErrorIs(t, err, idem.ErrInProgress)
				require.Equal(t, idem.OutcomeInProgress, out)
				return work("A")(ctx)
			})
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeExecuted, out)
			// An instance without the lease (table, cut off) writes no
			// copy: the hybrid's lease, read from the running row, says
			// "running" until that state is old enough to be checked.
			mr.FastForward(6 * time.Second)
			for _, g := range []*idem.Guard{a, b} {
				replay, out, err := g.Do(ctx, r, work("again"))
				require.NoError(t, err)
				require.Equal(t, idem.OutcomeReplayed, out)
				require.Equal(t, resp.Header.Get("Location"), replay.Header.Get("Location"))
			}
			require.EqualValues(t, 1, runs.Load())
			require.Zero(t, a.Stats().DoubleExecutions+b.Stats().DoubleExecutions)
		})
	}
}

// Redis unreachable: the hybrid falls back to the table claim for that
// request, so exactly-once rests on the unique constraint.
func TestHybridFallsBackWhenRedisFails(t *testing.T) {
	b := setup(t, "hybrid-miniredis")
	ctx := context.Background()
	r := req("u", newKey(), "x")
	w := &counter{resp: created("fallback")}

	b.mr.SetError("ERR injected failure")
	_, out, err := b.guard.Do(ctx, r, w.work)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out)
	_, out, err = b.guard.Do(ctx, r, w.work)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out)
	require.EqualValues(t, 2, b.guard.Stats().Fallbacks)

	b.mr.SetError("")
	_, out, err = b.guard.Do(ctx, r, w.work)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out, "the hybrid reads the row the fallback wrote")
	require.EqualValues(t, 1, w.n.Load())

	// A claim in progress taken during the outage still answers 409 once
	// Redis is back.
	r2 := req("u", newKey(), "y")
	b.mr.SetError("ERR injected failure")
	_, out, _ = b.guard.Do(ctx, r2, (&counter{resp: idem.Response{Status: 502}}).work)
	require.Equal(t, idem.OutcomeExecutedUnstored, out)
	b.mr.SetError("")
	_, out, _ = b.guard.Do(ctx, r2, nil2xx(t))
	require.Equal(t, idem.OutcomeInProgress, out)

	// Redis gone entirely.
	b.mr.Close()
	r3 := req("u", newKey(), "z")
	_, out, err = b.guard.Do(ctx, r3, w.work)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out)
}

// PostgreSQL unreachable: fail closed, never run the work unguarded.
func TestStoreUnavailableFailsClosed(t *testing.T) {
	for _, strategy := range []string{"table", "hybrid-miniredis"} {
		t.Run("strategy="+strategy, func(t *testing.T) {
			pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1")
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			store, err := durable.New(pool, nil)
			require.NoError(t, err)
			cfg := &idem.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), StoreTimeout: 2 * time.Second}
			var (
				mr     *miniredis.Miniredis
				locker *lock.Locker
			)
			if strategy != "table" {
				mr = miniredis.RunT(t)
				locker = mustLocker(t, testredis.Miniredis(t, mr))
				cfg.Lock = locker
			}
			g, err := idem.New(store, cfg)
			require.NoError(t, err)
			r := req("u", newKey(), "x")
			_, out, err := g.Do(context.Background(), r, nil2xx(t))
			require.ErrorIs(t, err, idem.ErrUnavailable)
			require.Equal(t, idem.OutcomeNone, out)
			require.EqualValues(t, 1, g.Stats().StoreErrors)
			if mr != nil {
				require.False(t, mr.Exists(locker.Key(r.Scope, r.Key)),
					"the lease must be released when the store cannot decide")
			}
		})
	}
}

// faultyStore fails Complete, as a store that dies between the
// work and storing its answer.
type faultyStore struct {
	idem.Store
	err error
}

func (f faultyStore) Complete(context.Context, string, string, idem.Token, idem.Response) error {
	return f.err
}

// The answer cannot be stored: the caller still gets it, and the key stays
// in progress rather than letting a retry run the work again.
func TestAnswerNotStoredKeepsKeyInProgress(t *testing.T) {
	for _, strategy := range []string{"table", "hybrid-miniredis"} {
		t.Run("strategy="+strategy, func(t *testing.T) {
			b := setup(t, strategy, func(o *setupOpts) {
				o.store = func(s idem.Store) idem.Store { return faultyStore{Store: s, err: errors.New("connection reset")} }
			})
			r := req("u", newKey(), "x")
			w := &counter{resp: created("lost")}
			resp, out, err := b.guard.Do(context.Background(), r, w.work)
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeExecutedUnstored, out)
			require.Equal(t, http.StatusCreated, resp.Status)
			_, out, err = b.guard.Do(context.Background(), r, w.work)
			require.ErrorIs(t, err, idem.ErrInProgress)
			require.Equal(t, idem.OutcomeInProgress, out)
			require.EqualValues(t, 1, w.n.Load())
		})
	}
}

func TestNewValidation(t *testing.T) {
	_, err := idem.New(nil, nil)
	require.Error(t, err)
	b := setup(t, "table")
	_, err = idem.New(b.store, &idem.Config{StoreTimeout: -1})
	require.ErrorContains(t, err, "Config.StoreTimeout")
	_, err = idem.New(b.store, &idem.Config{WorkTimeout: -1})
	require.ErrorContains(t, err, "Config.WorkTimeout")
	g, err := idem.New(b.store, nil)
	require.NoError(t, err)
	require.Equal(t, "table", g.Strategy())
	_, _, err = g.Do(context.Background(), req("u", "k", "x"), nil)
	require.Error(t, err)

	// A retention not longer than MaxHold would let a running key expire
	// and be claimed again: refused, naming both.
	short, err := durable.New(b.pool, &durable.Config{Retention: 30 * time.Second})
	require.NoError(t, err)
	_, err = idem.New(short, nil)
	require.ErrorContains(t, err, "retention 30s must be longer than the Guard's MaxHold 46.5s")
	_, err = idem.New(short, &idem.Config{WorkTimeout: 5 * time.Second, StoreTimeout: time.Second})
	require.NoError(t, err, "MaxHold 11.5s")
}

func TestOutcomeString(t *testing.T) {
	require.Equal(t, "executed", idem.OutcomeExecuted.String())
	require.Equal(t, "in_progress", idem.OutcomeInProgress.String())
	require.Equal(t, "outcome(42)", idem.Outcome(42).String())
	require.True(t, idem.OutcomeExecutedUnstored.Executed())
	require.False(t, idem.OutcomeReplayed.Executed())
}

// Settle and Release touch only the claim they name: a key claimed again by
// a new request meanwhile is left alone.
func TestSettleAndReleaseAreOwnerChecked(t *testing.T) {
	b := setup(t, "table")
	ctx := context.Background()
	r := req("u", newKey(), "x")
	_, _, _ = b.guard.Do(ctx, r, (&counter{resp: idem.Response{Status: 504}}).work)
	intent := ownerOf(t, b.store, r.Scope, r.Key)

	require.ErrorIs(t, b.guard.Settle(ctx, r.Scope, r.Key, idem.Token{9}, created("x")), idem.ErrNotOwner)
	require.ErrorIs(t, b.guard.Release(ctx, r.Scope, r.Key, idem.Token{9}), idem.ErrNotOwner)
	require.ErrorContains(t, b.guard.Settle(ctx, r.Scope, r.Key, intent, idem.Response{Status: 500}), "cannot be stored")
	require.NoError(t, b.guard.Settle(ctx, r.Scope, r.Key, intent, created("owned")))
	resp, out, err := b.guard.Do(ctx, r, nil2xx(t))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out)
	require.Equal(t, "/orders/owned", resp.Header.Get("Location"))

	r2 := req("u", newKey(), "y")
	_, _, _ = b.guard.Do(ctx, r2, (&counter{resp: idem.Response{Status: 504}}).work)
	old := ownerOf(t, b.store, r2.Scope, r2.Key)
	require.NoError(t, b.guard.Release(ctx, r2.Scope, r2.Key, old))
	_, out, err = b.guard.Do(ctx, r2, (&counter{resp: idem.Response{Status: 504}}).work)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecutedUnstored, out, "the retry is a new intent")
	require.ErrorIs(t, b.guard.Settle(ctx, r2.Scope, r2.Key, old, created("stale")), idem.ErrNotOwner,
		"a decision about the old intent does not touch the new one")
	require.EqualValues(t, 1, b.guard.Stats().Settled)
	require.EqualValues(t, 1, b.guard.Stats().Released)
}

// lostReplyStore commits the first Complete of each key and then reports it
// failed, as a connection reset between the commit and its reply.
type lostReplyStore struct {
	idem.Store
	lost sync.Map // scope\x00key -> true once a reply was lost
}

func (s *lostReplyStore) Complete(ctx context.Context, scope, key string, owner idem.Token, a idem.Response) error {
	if err := s.Store.Complete(ctx, scope, key, owner, a); err != nil {
		return err
	}
	if _, lost := s.lost.LoadOrStore(scope+"\x00"+key, true); !lost {
		return errors.New("read tcp: connection reset by peer")
	}
	return nil
}

// The answer's write commits but its reply is lost: the guard's retry of the
// write finds its own answer and succeeds. The key is answered at once, not
// left in progress, and nothing is counted as a double execution.
func TestLostReplyToCommittedAnswer(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		b := setup(t, strategy, func(o *setupOpts) {
			o.store = func(s idem.Store) idem.Store { return &lostReplyStore{Store: s} }
		})
		ctx := context.Background()
		r := req("u", newKey(), "x")
		w := &counter{resp: created("once")}
		_, out, err := b.guard.Do(ctx, r, w.work)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out)
		resp, out, err := b.guard.Do(ctx, r, w.work)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeReplayed, out)
		require.Equal(t, "/orders/once", resp.Header.Get("Location"))
		require.EqualValues(t, 1, w.n.Load())
		st := b.guard.Stats()
		require.Zero(t, st.DoubleExecutions)
		require.Zero(t, st.Unstored)
		require.Zero(t, st.StoreErrors)
	})
}

// lostClaimReplyStore commits the first Claim of each key and then reports
// it failed, as a connection reset between the commit and its reply.
type lostClaimReplyStore struct {
	idem.Store
	lost sync.Map
}

func (s *lostClaimReplyStore) Claim(ctx context.Context, p idem.ClaimParams) (idem.Record, bool, error) {
	rec, ok, err := s.Store.Claim(ctx, p)
	if err != nil {
		return rec, ok, err
	}
	if _, lost := s.lost.LoadOrStore(p.Scope+"\x00"+p.Key, true); !lost {
		return idem.Record{}, false, errors.New("read tcp: connection reset by peer")
	}
	return rec, ok, nil
}

// The claim commits but its reply is lost: that request is refused with
// ErrUnavailable and its work does not run; the row, whose owner is gone,
// holds retries at 409 until it is released (as a reconciler would, finding
// nothing happened), and then the work runs once.
func TestLostReplyToCommittedClaim(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		b := setup(t, strategy, func(o *setupOpts) {
			o.store = func(s idem.Store) idem.Store { return &lostClaimReplyStore{Store: s} }
		})
		ctx := context.Background()
		r := req("u", newKey(), "x")
		w := &counter{resp: created("once")}
		_, out, err := b.guard.Do(ctx, r, w.work)
		require.ErrorIs(t, err, idem.ErrUnavailable)
		require.Equal(t, idem.OutcomeNone, out)
		_, out, err = b.guard.Do(ctx, r, w.work)
		require.ErrorIs(t, err, idem.ErrInProgress)
		require.Equal(t, idem.OutcomeInProgress, out)
		require.Zero(t, w.n.Load())

		rec, err := b.store.Get(ctx, r.Scope, r.Key)
		require.NoError(t, err)
		require.NoError(t, b.guard.Release(ctx, r.Scope, r.Key, rec.Owner))
		_, out, err = b.guard.Do(ctx, r, w.work)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out)
		require.EqualValues(t, 1, w.n.Load())
	})
}

// A header value that is not UTF-8 cannot be stored byte for byte (JSON would
// change it): Do says so instead of storing another answer than the one it
// returns, and the key stays in progress.
func TestUnstorableHeaderIsRefusedAtDo(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		b := setup(t, strategy)
		r := req("u", newKey(), "x")
		resp, out, err := b.guard.Do(t.Context(), r, func(context.Context) (idem.Response, error) {
			return idem.Response{Status: 201, Header: http.Header{"Etag": {"\"caf\xe9\""}}}, nil
		})
		require.Equal(t, idem.OutcomeExecutedUnstored, out)
		require.ErrorIs(t, err, idem.ErrInvalid)
		require.Equal(t, 201, resp.Status)
		rec, gerr := b.store.Get(t.Context(), r.Scope, r.Key)
		require.NoError(t, gerr)
		require.True(t, rec.InProgress(), "nothing else was stored")
	})
}
