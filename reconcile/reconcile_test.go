package reconcile_test

import (
	"context"
	"crypto/rand"
	"errors"
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
	"go.uber.org/goleak"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/clock"
	"github.com/idemguard/idem/internal/testdb"
	"github.com/idemguard/idem/lock"
	"github.com/idemguard/idem/reconcile"
)

// bundle is what a test works with: a Guard on a store of its own schema,
// and a resolver whose answer the test sets.
type bundle struct {
	ctx   context.Context
	guard *idem.Guard
	store *durable.Store
	pool  *pgxpool.Pool
	res   *resolver
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func setup(t *testing.T, strategy string) *bundle {
	t.Helper()
	store, pool := testdb.Store(t, nil)
	cfg := &idem.Config{Logger: quiet(), WorkTimeout: 10 * time.Second}
	switch strategy {
	case "table":
	case "hybrid-miniredis":
		mr := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: mr.Addr(), MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		l, err := lock.New(c, nil)
		require.NoError(t, err)
		cfg.Lock = l
		cfg.WorkTimeout = 0 // the hybrid's default
	default:
		t.Fatalf("unknown strategy %q", strategy)
	}
	g, err := idem.New(store, cfg)
	require.NoError(t, err)
	// The rows a test moves into the past on the database's clock are as
	// old on the reconciler's (TestReconcilerCountsOnItsOwnClock runs
	// without this).
	ctx := clock.WithHeadStart(t.Context(), time.Hour)
	return &bundle{ctx: ctx, guard: g, store: store, pool: pool, res: &resolver{}}
}

func forEachStrategy(t *testing.T, fn func(t *testing.T, b *bundle)) {
	for _, s := range []string{"table", "hybrid-miniredis"} {
		t.Run("strategy="+s, func(t *testing.T) {
			t.Parallel()
			fn(t, setup(t, s))
		})
	}
}

// reconciler returns a Reconciler of b with the defaults (MinAge 1m,
// backoff 30s doubling), and cfg's fields where set; it logs to the
// Guard's quiet logger.
func (b *bundle) reconciler(t *testing.T, cfg *reconcile.Config, tune ...reconcile.Tuning) *reconcile.Reconciler {
	t.Helper()
	r, err := reconcile.New(b.guard, b.store, b.res.resolve, cfg)
	require.NoError(t, err)
	for _, tu := range tune {
		reconcile.Tune(r, tu)
	}
	return r
}

func (b *bundle) runOnce(t *testing.T, r *reconcile.Reconciler) reconcile.Result {
	t.Helper()
	res, err := r.RunOnce(b.ctx)
	require.NoError(t, err)
	return res
}

// age moves a row's created_at (and its deadline, hold_until, with it) into
// the past, on the database clock, as if it had been claimed that long ago. The mark of the reconciler's scan, if
// any, moves before it: no run could have passed the row before it was due.
func (b *bundle) age(t *testing.T, scope, key, by string) {
	t.Helper()
	var created time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx,
		`UPDATE `+b.store.Table()+` SET created_at = now() - $3::interval,
			hold_until = hold_until - (created_at - (now() - $3::interval))
		WHERE user_id = $1 AND key = $2 RETURNING created_at`,
		scope, key, by).Scan(&created))
	_, err := b.pool.Exec(b.ctx, `UPDATE `+b.stateTable()+` SET scanned_to = least(scanned_to, $1::timestamptz - interval '1 microsecond')`, created)
	require.NoError(t, err)
}

// state reads a row's reconcile attempts and how far in the future its
// reconcile_after is (0 when NULL or past).
func (b *bundle) state(t *testing.T, scope, key string) (attempts int, wait time.Duration) {
	t.Helper()
	var secs float64
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT reconcile_attempts, greatest(coalesce(extract(epoch FROM reconcile_after - now()), 0), 0)
FROM `+b.store.Table()+` WHERE user_id = $1 AND key = $2`, scope, key).Scan(&attempts, &secs))
	return attempts, time.Duration(secs * float64(time.Second))
}

// makeDue moves a postponed row's reconcile_after into the past.
func (b *bundle) makeDue(t *testing.T, scope, key string) {
	t.Helper()
	tag, err := b.pool.Exec(b.ctx, `UPDATE `+b.store.Table()+
		` SET reconcile_after = now() - interval '1 second' WHERE user_id = $1 AND key = $2`, scope, key)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
}

// resolver answers with fn (Unknown when nil) and records the items.
type resolver struct {
	mu    sync.Mutex
	fn    func(ctx context.Context, it reconcile.Item) (reconcile.Decision, error)
	items []reconcile.Item
}

func (r *resolver) set(fn func(ctx context.Context, it reconcile.Item) (reconcile.Decision, error)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fn = fn
}

func (r *resolver) answer(d reconcile.Decision, err error) {
	r.set(func(context.Context, reconcile.Item) (reconcile.Decision, error) { return d, err })
}

func (r *resolver) resolve(ctx context.Context, it reconcile.Item) (reconcile.Decision, error) {
	r.mu.Lock()
	r.items = append(r.items, it)
	fn := r.fn
	r.mu.Unlock()
	if fn == nil {
		return reconcile.Decision{}, nil
	}
	return fn(ctx, it)
}

// calls returns and forgets the recorded items.
func (r *resolver) calls() []reconcile.Item {
	r.mu.Lock()
	defer r.mu.Unlock()
	items := r.items
	r.items = nil
	return items
}

func newKey() string { return "key-" + rand.Text() }

func request(key string) idem.Request {
	return idem.Request{Scope: "user-1", Key: key, Fingerprint: idem.HashRequest("POST", "/orders", []byte(`{"a":1}`))}
}

// work counts executions and answers resp.
type work struct {
	n    atomic.Int32
	resp idem.Response
}

func (w *work) do(context.Context) (idem.Response, error) {
	w.n.Add(1)
	return w.resp, nil
}

func created(id string) idem.Response {
	return idem.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Location": {"/orders/" + id}, "Content-Type": {"application/json"}},
		Body:   []byte(`{"id":"` + id + `"}`),
	}
}

// timedOut runs req with a 504 (the payment timed out): the key stays in
// progress and a retry gets ErrInProgress.
func (b *bundle) timedOut(t *testing.T, req idem.Request) {
	t.Helper()
	w := &work{resp: idem.Response{Status: http.StatusGatewayTimeout}}
	_, out, err := b.guard.Do(b.ctx, req, w.do)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecutedUnstored, out)

	_, out, err = b.guard.Do(b.ctx, req, w.do)
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.Equal(t, idem.OutcomeInProgress, out)
	require.EqualValues(t, 1, w.n.Load())
}

func TestSettledIsReplayed(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, b *bundle) {
		req := request(newKey())
		b.timedOut(t, req)
		r := b.reconciler(t, nil)
		b.res.answer(reconcile.Decision{Verdict: reconcile.Settled, Response: created("o1")}, nil)

		// Younger than MinAge: untouched.
		require.Equal(t, reconcile.Result{}, b.runOnce(t, r))
		require.Empty(t, b.res.calls())

		b.age(t, req.Scope, req.Key, "2 minutes")
		require.Equal(t, reconcile.Result{Settled: 1}, b.runOnce(t, r))
		items := b.res.calls()
		require.Len(t, items, 1)
		require.Equal(t, req.Scope, items[0].Scope)
		require.Equal(t, req.Key, items[0].Key)
		require.Equal(t, req.Fingerprint, items[0].Fingerprint)
		require.Zero(t, items[0].Attempts)
		require.WithinDuration(t, time.Now().Add(-2*time.Minute), items[0].CreatedAt, time.Minute)

		w := &work{resp: created("o2")}
		resp, out, err := b.guard.Do(b.ctx, req, w.do)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeReplayed, out)
		require.Equal(t, created("o1"), resp)
		require.Zero(t, w.n.Load())
		require.EqualValues(t, 1, b.guard.Stats().Settled)

		// Nothing left to do.
		require.Equal(t, reconcile.Result{}, b.runOnce(t, r))
	})
}

func TestNothingHappenedReleases(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, b *bundle) {
		req := request(newKey())
		b.timedOut(t, req)
		b.age(t, req.Scope, req.Key, "2 minutes")
		b.res.answer(reconcile.Decision{Verdict: reconcile.NothingHappened}, nil)
		require.Equal(t, reconcile.Result{Released: 1}, b.runOnce(t, b.reconciler(t, nil)))

		w := &work{resp: created("o2")}
		resp, out, err := b.guard.Do(b.ctx, req, w.do)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out)
		require.Equal(t, created("o2"), resp)
		require.EqualValues(t, 1, w.n.Load())
	})
}

func TestUnknownBacksOff(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, b *bundle) {
		req := request(newKey())
		b.timedOut(t, req)
		b.age(t, req.Scope, req.Key, "2 minutes")
		r := b.reconciler(t, nil) // backoff 30s, doubling

		require.Equal(t, reconcile.Result{Unknown: 1}, b.runOnce(t, r))
		attempts, wait := b.state(t, req.Scope, req.Key)
		require.Equal(t, 1, attempts)
		require.InDelta(t, 30*time.Second, wait, float64(5*time.Second))
		require.Len(t, b.res.calls(), 1)

		// Not retried before its time.
		require.Equal(t, reconcile.Result{}, b.runOnce(t, r))
		require.Empty(t, b.res.calls())
		_, _, err := b.guard.Do(b.ctx, req, (&work{}).do)
		require.ErrorIs(t, err, idem.ErrInProgress)

		// Its time has come: tried again, still unknown, waits twice as long.
		b.makeDue(t, req.Scope, req.Key)
		require.Equal(t, reconcile.Result{Unknown: 1}, b.runOnce(t, r))
		items := b.res.calls()
		require.Len(t, items, 1)
		require.Equal(t, 1, items[0].Attempts)
		attempts, wait = b.state(t, req.Scope, req.Key)
		require.Equal(t, 2, attempts)
		require.InDelta(t, time.Minute, wait, float64(5*time.Second))

		// A new Reconciler (a restart, another instance) keeps the backoff.
		r = b.reconciler(t, nil)
		require.Equal(t, reconcile.Result{}, b.runOnce(t, r))

		b.makeDue(t, req.Scope, req.Key)
		b.res.answer(reconcile.Decision{Verdict: reconcile.Settled, Response: created("o1")}, nil)
		require.Equal(t, reconcile.Result{Settled: 1}, b.runOnce(t, r))
		require.Equal(t, 2, b.res.calls()[0].Attempts)
		resp, out, err := b.guard.Do(b.ctx, req, (&work{}).do)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeReplayed, out)
		require.Equal(t, created("o1"), resp)
	})
}

// TestCrashedOwner: a request whose process died mid-work left only its
// claim (table strategy): it is found like a 5xx.
func TestCrashedOwner(t *testing.T) {
	t.Parallel()
	b := setup(t, "table")
	req := request(newKey())
	var owner idem.Token
	_, _ = rand.Read(owner[:])
	_, claimed, err := b.store.Claim(b.ctx, idem.ClaimParams{Scope: req.Scope, Key: req.Key, Fingerprint: req.Fingerprint, Owner: owner})
	require.NoError(t, err)
	require.True(t, claimed)
	_, _, err = b.guard.Do(b.ctx, req, (&work{}).do)
	require.ErrorIs(t, err, idem.ErrInProgress)

	b.age(t, req.Scope, req.Key, "10 minutes")
	b.res.answer(reconcile.Decision{Verdict: reconcile.NothingHappened}, nil)
	require.Equal(t, reconcile.Result{Released: 1}, b.runOnce(t, b.reconciler(t, nil)))
	require.Equal(t, req.Fingerprint, b.res.calls()[0].Fingerprint)

	w := &work{resp: created("o1")}
	_, out, err := b.guard.Do(b.ctx, req, w.do)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out)
}

func TestMinAgeAndOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, "table")
	claim := func(key string) {
		var owner idem.Token
		_, _ = rand.Read(owner[:])
		_, claimed, err := b.store.Claim(b.ctx, idem.ClaimParams{Scope: "user-1", Key: key, Fingerprint: request(key).Fingerprint, Owner: owner})
		require.NoError(t, err)
		require.True(t, claimed)
	}
	for key, age := range map[string]string{"k3": "3 minutes", "k9": "9 minutes", "k5": "5 minutes", "k4m": "4 minutes"} {
		claim(key)
		b.age(t, "user-1", key, age)
	}
	claim("fresh")
	b.age(t, "user-1", "fresh", "50 seconds")

	r := b.reconciler(t, &reconcile.Config{MinAge: 4*time.Minute + 30*time.Second})
	require.Equal(t, reconcile.Result{Unknown: 2}, b.runOnce(t, r))
	var keys []string
	for _, it := range b.res.calls() {
		keys = append(keys, it.Key)
	}
	require.Equal(t, []string{"k9", "k5"}, keys, "older than MinAge only, oldest first")

	r = b.reconciler(t, nil) // MinAge 1m
	b.res.answer(reconcile.Decision{Verdict: reconcile.NothingHappened}, nil)
	require.Equal(t, reconcile.Result{Released: 2}, b.runOnce(t, r), "k9 and k5 are postponed")
	keys = nil
	for _, it := range b.res.calls() {
		keys = append(keys, it.Key)
	}
	require.Equal(t, []string{"k4m", "k3"}, keys)
	attempts, _ := b.state(t, "user-1", "fresh")
	require.Zero(t, attempts, "the fresh row was never touched")
}

func TestBatches(t *testing.T) {
	t.Parallel()
	b := setup(t, "table")
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO `+b.store.Table()+` (user_id, key, request_hash, owner_token, created_at, hold_until, retention)
SELECT 'user-1', 'key-' || g, sha256(g::text::bytea), decode(md5(g::text), 'hex'), now() - interval '1 hour' + g * interval '1 second',
	now() - interval '1 hour' + g * interval '1 second', interval '24 hours'
FROM generate_series(1, 250) AS g`)
	require.NoError(t, err)
	b.res.answer(reconcile.Decision{Verdict: reconcile.NothingHappened}, nil)
	r := b.reconciler(t, nil, reconcile.Tuning{BatchSize: 100})
	require.Equal(t, reconcile.Result{Released: 250}, b.runOnce(t, r))
	items := b.res.calls()
	require.Len(t, items, 250)
	for i := 1; i < len(items); i++ {
		require.True(t, items[i-1].CreatedAt.Before(items[i].CreatedAt), "oldest first")
	}
}

func TestResolverFailures(t *testing.T) {
	tests := []struct {
		name string
		fn   func(ctx context.Context, it reconcile.Item) (reconcile.Decision, error)
	}{
		{name: "error", fn: func(context.Context, reconcile.Item) (reconcile.Decision, error) {
			return reconcile.Decision{Verdict: reconcile.Settled, Response: created("x")}, errors.New("provider down")
		}},
		{name: "panic", fn: func(context.Context, reconcile.Item) (reconcile.Decision, error) {
			panic("resolver bug")
		}},
		{name: "timeout", fn: func(ctx context.Context, _ reconcile.Item) (reconcile.Decision, error) {
			<-ctx.Done()
			return reconcile.Decision{}, ctx.Err()
		}},
		{name: "settled with a 5xx", fn: func(context.Context, reconcile.Item) (reconcile.Decision, error) {
			return reconcile.Decision{Verdict: reconcile.Settled, Response: idem.Response{Status: 503}}, nil
		}},
		{name: "invalid verdict", fn: func(context.Context, reconcile.Item) (reconcile.Decision, error) {
			return reconcile.Decision{Verdict: 42}, nil
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, "table")
			req := request(newKey())
			b.timedOut(t, req)
			b.age(t, req.Scope, req.Key, "2 minutes")
			b.res.set(tt.fn)
			r := b.reconciler(t, nil, reconcile.Tuning{ResolveTimeout: 50 * time.Millisecond})
			require.Equal(t, reconcile.Result{Errors: 1}, b.runOnce(t, r))
			attempts, wait := b.state(t, req.Scope, req.Key)
			require.Equal(t, 1, attempts, "postponed like Unknown")
			require.Greater(t, wait, 20*time.Second)
			_, _, err := b.guard.Do(b.ctx, req, (&work{}).do)
			require.ErrorIs(t, err, idem.ErrInProgress, "nothing settled")
		})
	}
}

// TestRaces: the key changes while the resolver works. Whatever the decision,
// it is not applied to a key that is no longer the listed intent.
func TestRaces(t *testing.T) {
	type setupFn func(t *testing.T, b *bundle, owner idem.Token, req idem.Request)
	completed := func(t *testing.T, b *bundle, owner idem.Token, req idem.Request) {
		require.NoError(t, b.store.Complete(b.ctx, req.Scope, req.Key, owner, idem.Response{Status: 202}))
	}
	retaken := func(t *testing.T, b *bundle, owner idem.Token, req idem.Request) {
		require.NoError(t, b.store.Release(b.ctx, req.Scope, req.Key, owner))
		var other idem.Token
		_, _ = rand.Read(other[:])
		_, claimed, err := b.store.Claim(b.ctx, idem.ClaimParams{Scope: req.Scope, Key: req.Key, Fingerprint: req.Fingerprint, Owner: other})
		require.NoError(t, err)
		require.True(t, claimed)
	}
	released := func(t *testing.T, b *bundle, owner idem.Token, req idem.Request) {
		require.NoError(t, b.store.Release(b.ctx, req.Scope, req.Key, owner))
	}
	tests := []struct {
		name      string
		meanwhile setupFn
		verdict   reconcile.Verdict
		check     func(t *testing.T, b *bundle, req idem.Request)
	}{
		{name: "completed, then settled", meanwhile: completed, verdict: reconcile.Settled, check: func(t *testing.T, b *bundle, req idem.Request) {
			rec, err := b.store.Get(b.ctx, req.Scope, req.Key)
			require.NoError(t, err)
			require.Equal(t, 202, rec.Answer.Status, "the owner's answer stays")
		}},
		{name: "completed, then released", meanwhile: completed, verdict: reconcile.NothingHappened, check: func(t *testing.T, b *bundle, req idem.Request) {
			_, err := b.store.Get(b.ctx, req.Scope, req.Key)
			require.NoError(t, err)
		}},
		{name: "completed, then unknown", meanwhile: completed, verdict: reconcile.Unknown},
		{name: "taken over, then released", meanwhile: retaken, verdict: reconcile.NothingHappened, check: func(t *testing.T, b *bundle, req idem.Request) {
			rec, err := b.store.Get(b.ctx, req.Scope, req.Key)
			require.NoError(t, err)
			require.True(t, rec.InProgress(), "the new intent is untouched")
		}},
		{name: "taken over, then settled", meanwhile: retaken, verdict: reconcile.Settled, check: func(t *testing.T, b *bundle, req idem.Request) {
			rec, err := b.store.Get(b.ctx, req.Scope, req.Key)
			require.NoError(t, err)
			require.True(t, rec.InProgress(), "the new intent is untouched")
		}},
		{name: "taken over, then unknown", meanwhile: retaken, verdict: reconcile.Unknown, check: func(t *testing.T, b *bundle, req idem.Request) {
			attempts, _ := b.state(t, req.Scope, req.Key)
			require.Zero(t, attempts, "the new intent is untouched")
		}},
		{name: "released, then settled", meanwhile: released, verdict: reconcile.Settled, check: func(t *testing.T, b *bundle, req idem.Request) {
			_, err := b.store.Get(b.ctx, req.Scope, req.Key)
			require.ErrorIs(t, err, idem.ErrNotFound)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, "table")
			req := request(newKey())
			var owner idem.Token
			_, _ = rand.Read(owner[:])
			_, _, err := b.store.Claim(b.ctx, idem.ClaimParams{Scope: req.Scope, Key: req.Key, Fingerprint: req.Fingerprint, Owner: owner})
			require.NoError(t, err)
			b.age(t, req.Scope, req.Key, "2 minutes")
			b.res.set(func(context.Context, reconcile.Item) (reconcile.Decision, error) {
				tt.meanwhile(t, b, owner, req)
				return reconcile.Decision{Verdict: tt.verdict, Response: created("o1")}, nil
			})
			require.Equal(t, reconcile.Result{Skipped: 1}, b.runOnce(t, b.reconciler(t, nil)))
			if tt.check != nil {
				tt.check(t, b, req)
			}
		})
	}
}

func TestOneReconcilerAtATime(t *testing.T) {
	t.Parallel()
	b := setup(t, "table")
	req := request(newKey())
	b.timedOut(t, req)
	b.age(t, req.Scope, req.Key, "2 minutes")

	inside := make(chan struct{})
	leave := make(chan struct{})
	b.res.set(func(context.Context, reconcile.Item) (reconcile.Decision, error) {
		close(inside)
		<-leave
		return reconcile.Decision{Verdict: reconcile.NothingHappened}, nil
	})
	first, second := b.reconciler(t, nil), b.reconciler(t, nil)
	done := make(chan reconcile.Result, 1)
	go func() {
		res, err := first.RunOnce(b.ctx)
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	<-inside
	res, err := second.RunOnce(b.ctx)
	require.ErrorIs(t, err, durable.ErrLocked)
	require.Equal(t, reconcile.Result{}, res)
	close(leave)
	require.Equal(t, reconcile.Result{Released: 1}, <-done)
	require.Len(t, b.res.calls(), 1, "the key was resolved once")

	// Concurrent runs over many keys: each key resolved exactly once.
	b.res.answer(reconcile.Decision{Verdict: reconcile.NothingHappened}, nil)
	for range 20 {
		k := newKey()
		b.timedOut(t, request(k))
		b.age(t, "user-1", k, "2 minutes")
	}
	var (
		wg    sync.WaitGroup
		total atomic.Int32
	)
	for range 4 {
		r := b.reconciler(t, nil)
		wg.Go(func() {
			res, err := r.RunOnce(b.ctx)
			if err != nil && !errors.Is(err, durable.ErrLocked) {
				t.Error(err)
			}
			total.Add(int32(res.Released))
		})
	}
	wg.Wait()
	require.EqualValues(t, 20, total.Load())
	require.Len(t, b.res.calls(), 20)
}

// TestRun is not parallel: goleak looks at every goroutine.
func TestRun(t *testing.T) {
	b := setup(t, "table")
	req := request(newKey())
	b.timedOut(t, req)
	b.age(t, req.Scope, req.Key, "2 minutes")
	leaks := goleak.IgnoreCurrent()

	b.res.set(func(context.Context, reconcile.Item) (reconcile.Decision, error) { panic("resolver bug") })
	results := make(chan reconcile.Result, 10)
	r := b.reconciler(t, &reconcile.Config{Interval: time.Hour}, reconcile.Tuning{
		OnResult: func(res reconcile.Result, _ time.Duration, err error) {
			if err != nil {
				t.Error(err)
			}
			results <- res
		},
	})
	ctx, cancel := context.WithCancel(b.ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- r.Run(ctx) }()

	// The first run starts at once; the panic is counted, not fatal.
	require.Equal(t, reconcile.Result{Errors: 1}, <-results)
	require.Error(t, r.Run(ctx), "Run is already running")
	cancel()
	select {
	case err := <-stopped:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop")
	}
	require.Empty(t, results)
	goleak.VerifyNone(t, leaks)
}

// TestStopDuringResolve: a run stopped while a resolver works leaves the key
// due and untouched.
func TestStopDuringResolve(t *testing.T) {
	t.Parallel()
	b := setup(t, "table")
	req := request(newKey())
	b.timedOut(t, req)
	b.age(t, req.Scope, req.Key, "2 minutes")
	ctx, cancel := context.WithCancel(b.ctx)
	b.res.set(func(ctx context.Context, _ reconcile.Item) (reconcile.Decision, error) {
		cancel()
		<-ctx.Done()
		return reconcile.Decision{}, ctx.Err()
	})
	res, err := b.reconciler(t, nil).RunOnce(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, reconcile.Result{}, res)
	attempts, wait := b.state(t, req.Scope, req.Key)
	require.Zero(t, attempts)
	require.Zero(t, wait)
}

// unbounded is a Guard that cannot say how long its requests hold a key.
type unbounded struct{ *idem.Guard }

func (unbounded) MaxHold() time.Duration { return 0 }

func TestNewValidation(t *testing.T) {
	t.Parallel()
	store, err := durable.New(nopDB{}, nil)
	require.NoError(t, err)
	g, err := idem.New(store, nil)
	require.NoError(t, err)
	resolve := func(context.Context, reconcile.Item) (reconcile.Decision, error) { return reconcile.Decision{}, nil }

	_, err = reconcile.New(g, store, resolve, nil)
	require.NoError(t, err)
	for name, cfg := range map[string]*reconcile.Config{
		"Config.Interval": {Interval: -1},
		"Config.MinAge":   {MinAge: -1},
	} {
		_, err := reconcile.New(g, store, resolve, cfg)
		require.ErrorContains(t, err, "reconcile: "+name, name)
	}
	// MinAge must exceed how long a running request may hold its key.
	bounded, err := idem.New(store, &idem.Config{WorkTimeout: time.Minute})
	require.NoError(t, err)
	require.Equal(t, time.Minute+time.Second+5*5*time.Second+500*time.Millisecond, bounded.MaxHold())
	_, err = reconcile.New(bounded, store, resolve, nil) // default MinAge 1m
	require.ErrorContains(t, err, "Config.MinAge")
	_, err = reconcile.New(bounded, store, resolve, &reconcile.Config{MinAge: 2 * time.Minute})
	require.NoError(t, err)
	_, err = reconcile.New(unbounded{g}, store, resolve, &reconcile.Config{MinAge: time.Hour})
	require.ErrorContains(t, err, "bounds nothing", "a guard that cannot bound its requests is refused")

	_, err = reconcile.New(nil, store, resolve, nil)
	require.Error(t, err)
	_, err = reconcile.New(g, nil, resolve, nil)
	require.Error(t, err)
	_, err = reconcile.New(g, store, nil, nil)
	require.Error(t, err)
}
