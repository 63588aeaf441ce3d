package idem_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemguard/idem"
)

// countingStore counts the round trips the guard makes to the store.
type countingStore struct {
	idem.Store
	calls atomic.Int32
}

func (c *countingStore) Claim(ctx context.Context, p idem.ClaimParams) (idem.Record, bool, error) {
	c.calls.Add(1)
	return c.Store.Claim(ctx, p)
}

func (c *countingStore) Get(ctx context.Context, scope, key string) (idem.Record, error) {
	c.calls.Add(1)
	return c.Store.Get(ctx, scope, key)
}

func (c *countingStore) Retention() time.Duration { return 24 * time.Hour }

// A cached answer is replayed, or a mismatch refused, without a round trip;
// in-progress state is never cached.
func TestCacheServesFinishedAnswersOnly(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		var cs *countingStore
		b := setup(t, strategy, func(o *setupOpts) {
			o.cfg.CacheSize = 16
			o.store = func(s idem.Store) idem.Store { cs = &countingStore{Store: s}; return cs }
		})
		ctx := context.Background()
		r := req("u", newKey(), "x")
		w := &counter{resp: created("cached")}
		_, out, err := b.guard.Do(ctx, r, w.work)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out)

		before := cs.calls.Load()
		for range 5 {
			resp, out, err := b.guard.Do(ctx, r, w.work)
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeReplayed, out)
			require.Equal(t, "/orders/cached", resp.Header.Get("Location"))
			resp.Header.Set("Location", "/mutated") // must not reach the next replay
		}
		_, out, err = b.guard.Do(ctx, req("u", r.Key, "other"), w.work)
		require.ErrorIs(t, err, idem.ErrKeyReused)
		require.Equal(t, idem.OutcomeKeyReused, out)
		require.Equal(t, before, cs.calls.Load(), "cache hits make no round trip")
		require.EqualValues(t, 5, b.guard.Stats().CacheHits)

		// In progress: never from the cache. The table asks the store;
		// the hybrid's lease answers.
		p := req("u", newKey(), "p")
		_, _, _ = b.guard.Do(ctx, p, (&counter{resp: idem.Response{Status: 504}}).work)
		before, hits := cs.calls.Load(), b.guard.Stats().CacheHits
		_, out, _ = b.guard.Do(ctx, p, w.work)
		require.Equal(t, idem.OutcomeInProgress, out)
		require.Equal(t, hits, b.guard.Stats().CacheHits, "in-progress state is never cached")
		if strategy == "table" {
			require.Greater(t, cs.calls.Load(), before)
		}

		// Settled later: the retry reads the settled answer.
		require.NoError(t, b.guard.Settle(ctx, p.Scope, p.Key, ownerOf(t, b.store, p.Scope, p.Key), created("settled")))
		resp, out, err := b.guard.Do(ctx, p, w.work)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeReplayed, out)
		require.Equal(t, "/orders/settled", resp.Header.Get("Location"))
		require.EqualValues(t, 1, w.n.Load())
	})
}

func TestCacheConfigValidation(t *testing.T) {
	b := setup(t, "table")
	_, err := idem.New(b.store, &idem.Config{CacheSize: -1})
	require.ErrorContains(t, err, "Config.CacheSize")
}

// Metrics go through the OpenTelemetry API: events by name and phase
// durations.
func TestMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	b := setup(t, "hybrid-miniredis", func(o *setupOpts) { o.cfg.MeterProvider = mp })
	ctx := context.Background()
	r := req("u", newKey(), "x")
	_, _, err := b.guard.Do(ctx, r, (&counter{resp: created("m")}).work)
	require.NoError(t, err)
	_, _, _ = b.guard.Do(ctx, r, nil2xx(t))
	_, _, _ = b.guard.Do(ctx, req("u", r.Key, "y"), nil2xx(t))
	b.mr.SetError("ERR down")
	_, _, err = b.guard.Do(ctx, req("u", newKey(), "z"), (&counter{resp: created("f")}).work)
	require.NoError(t, err)
	b.mr.SetError("")

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	events := map[string]int64{}
	phases := map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				require.Equal(t, idem.MetricEvents, m.Name)
				for _, p := range d.DataPoints {
					v, _ := p.Attributes.Value("event")
					events[v.AsString()] += p.Value
				}
			case metricdata.Histogram[float64]:
				require.Equal(t, idem.MetricPhase, m.Name)
				for _, p := range d.DataPoints {
					v, _ := p.Attributes.Value("phase")
					phases[v.AsString()] += p.Count
				}
			}
		}
	}
	require.Equal(t, map[string]int64{"executed": 2, "replayed": 1, "key_reused": 1, "fallback": 1, "lease_answered": 2}, events)
	require.EqualValues(t, 4, phases["lock"])
	require.EqualValues(t, 2, phases["claim"], "the lease holder claims, and so does the fallback")
	require.Zero(t, phases["read"], "the replay and the reused key are answered from the lease's copy")
	require.EqualValues(t, 2, phases["store"])
	require.EqualValues(t, 1, phases["lease"], "the copy of the first answer; none while Redis is down")
}

// The order row and the stored answer commit together or not at all.
func TestTransactionalJoin(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		b := setup(t, strategy)
		ctx := context.Background()
		orders := strings.TrimSuffix(b.store.Table(), `"`) + `_orders"` // "schema"."idempotency_keys_orders"
		_, err := b.pool.Exec(ctx, "CREATE TABLE "+orders+" (id text PRIMARY KEY)")
		require.NoError(t, err)
		count := func() (n int) {
			require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+orders).Scan(&n))
			return n
		}
		work := func(commit bool, status int) idem.Work {
			return func(ctx context.Context) (idem.Response, error) {
				intent := idem.ExecutionFromContext(ctx).Intent
				require.NotZero(t, intent)
				id := idem.DeriveID("ord_", "order", intent)
				tx, err := b.pool.Begin(ctx)
				require.NoError(t, err)
				defer tx.Rollback(context.WithoutCancel(ctx))
				_, err = tx.Exec(ctx, "INSERT INTO "+orders+" (id) VALUES ($1)", id)
				require.NoError(t, err)
				resp := created(id)
				require.NoError(t, idem.Complete(ctx, tx, resp))
				if !commit {
					require.NoError(t, tx.Rollback(ctx))
					return idem.Response{Status: status}, nil
				}
				require.NoError(t, tx.Commit(ctx))
				return resp, nil
			}
		}

		// Committed: the order and the answer exist together.
		r := req("u", newKey(), "x")
		resp, out, err := b.guard.Do(ctx, r, work(true, 0))
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out)
		require.Equal(t, 1, count())
		replay, out, err := b.guard.Do(ctx, r, nil2xx(t))
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeReplayed, out)
		require.Equal(t, resp.Body, replay.Body)

		// Rolled back, then a 5xx: neither the order nor an answer; the key
		// is in progress.
		r2 := req("u", newKey(), "y")
		_, out, _ = b.guard.Do(ctx, r2, work(false, http.StatusInternalServerError))
		require.Equal(t, idem.OutcomeExecutedUnstored, out)
		require.Equal(t, 1, count())
		_, out, err = b.guard.Do(ctx, r2, nil2xx(t))
		require.ErrorIs(t, err, idem.ErrInProgress)
		require.Equal(t, idem.OutcomeInProgress, out)

		// Rolled back, yet the work answers as if it had committed: the
		// answer is never stored (no order exists to back it); the key is
		// in progress until a reconciler finds out what happened.
		r4 := req("u", newKey(), "w")
		resp4, out, err := b.guard.Do(ctx, r4, work(false, http.StatusCreated))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, resp4.Status)
		require.Equal(t, idem.OutcomeExecutedUnstored, out)
		_, out, err = b.guard.Do(ctx, r4, nil2xx(t))
		require.ErrorIs(t, err, idem.ErrInProgress, "the rolled-back 201 must not be replayed")
		require.Equal(t, idem.OutcomeInProgress, out)
		require.Equal(t, 1, count())

		// Rolled back with a declared "nothing happened": the retry runs
		// and commits.
		r3 := req("u", newKey(), "z")
		_, out, _ = b.guard.Do(ctx, r3, work(false, http.StatusTooManyRequests))
		require.Equal(t, idem.OutcomeExecutedReleased, out)
		_, out, err = b.guard.Do(ctx, r3, work(true, 0))
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out)
		require.Equal(t, 2, count())
	})
}

func TestCompleteErrors(t *testing.T) {
	b := setup(t, "table")
	ctx := context.Background()
	require.ErrorIs(t, idem.Complete(ctx, b.pool, created("x")), idem.ErrNotGuarded)

	_, _, _ = b.guard.Do(ctx, req("u", newKey(), "x"), func(ctx context.Context) (idem.Response, error) {
		require.ErrorContains(t, idem.Complete(ctx, b.pool, idem.Response{Status: 503}), "cannot be stored")
		return created("x"), nil
	})

	wrapped := setup(t, "table", func(o *setupOpts) {
		o.store = func(s idem.Store) idem.Store { return &countingStore{Store: s} }
	})
	_, _, _ = wrapped.guard.Do(ctx, req("u", newKey(), "x"), func(ctx context.Context) (idem.Response, error) {
		require.ErrorIs(t, idem.Complete(ctx, b.pool, created("x")), idem.ErrJoinUnsupported)
		return created("x"), nil
	})
}

// A guarded HTTP handler joins its transaction; only allowlisted headers are
// stored.
func TestMiddlewareTransactionalJoin(t *testing.T) {
	var hb httpBundle
	var calls atomic.Int32
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		tx, err := hb.pool.Begin(r.Context())
		if err != nil {
			http.Error(w, "db", http.StatusServiceUnavailable)
			return
		}
		defer tx.Rollback(context.WithoutCancel(r.Context()))
		resp := idem.Response{Status: 201, Header: http.Header{
			"Location": {"/orders/joined"}, "Set-Cookie": {"s=1"}, "Content-Type": {"text/plain"},
		}, Body: []byte("joined")}
		if err := idem.Complete(r.Context(), tx, resp); err != nil || tx.Commit(r.Context()) != nil {
			http.Error(w, "db", http.StatusServiceUnavailable)
			return
		}
		resp.Write(w)
	})
	hb = setupHTTP(t, "table", handler)
	key := newKey()
	first := send(t, hb.srv, call{user: "u", keys: []string{key}})
	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, "s=1", first.header.Get("Set-Cookie"))
	again := send(t, hb.srv, call{user: "u", keys: []string{key}})
	require.Equal(t, http.StatusCreated, again.status)
	require.Equal(t, "joined", string(again.body))
	require.Equal(t, "/orders/joined", again.header.Get("Location"))
	require.Empty(t, again.header.Get("Set-Cookie"))
	require.EqualValues(t, 1, calls.Load())
}

func TestDeriveID(t *testing.T) {
	a := idem.Token{1, 2, 3}
	id := idem.DeriveID("ord_", "order", a)
	require.True(t, strings.HasPrefix(id, "ord_"))
	require.Len(t, id, len("ord_")+26)
	require.Equal(t, id, idem.DeriveID("ord_", "order", a), "stable")
	require.Equal(t, strings.ToLower(id), id)
	others := []string{
		idem.DeriveID("ord_", "payment", a),
		idem.DeriveID("ord_", "order", idem.Token{1, 2, 4}),
		idem.DeriveID("ord_", "order", idem.Token{}),
	}
	for _, o := range others {
		require.NotEqual(t, id[4:], o[4:])
	}
	require.Len(t, a.String(), 26)
	require.Equal(t, strings.ToLower(a.String()), a.String())
}

// A handler that completes one answer and returns (or writes) another: the
// caller gets the completed one, as every retry does, and the guard counts
// and logs the mismatch.
func TestAnswerMismatchIsCounted(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		b := setup(t, strategy)
		ctx := context.Background()
		r := req("u", newKey(), "x")
		resp, out, err := b.guard.Do(ctx, r, func(ctx context.Context) (idem.Response, error) {
			require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				return idem.Complete(ctx, tx, created("completed"))
			}))
			return created("returned"), nil
		})
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out)
		require.Equal(t, "/orders/completed", resp.Header.Get("Location"), "what is stored, not what was returned")
		require.EqualValues(t, 1, b.guard.Stats().AnswerMismatches)
		replay, _, _ := b.guard.Do(ctx, r, nil2xx(t))
		require.Equal(t, "/orders/completed", replay.Header.Get("Location"))

		same := req("u", newKey(), "y")
		_, _, err = b.guard.Do(ctx, same, func(ctx context.Context) (idem.Response, error) {
			require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				return idem.Complete(ctx, tx, created("same"))
			}))
			return created("same"), nil
		})
		require.NoError(t, err)
		require.EqualValues(t, 1, b.guard.Stats().AnswerMismatches, "the same answer is no mismatch")
	})
}

func TestDownstreamKey(t *testing.T) {
	k, err := idem.DownstreamKey("order", "ord_abc")
	require.NoError(t, err)
	require.Equal(t, "order-ord_abc", k)
	for _, tc := range [][2]string{
		{"", "x"}, {"order", ""}, {"order", "a b"}, {"order", "é"}, {"order", `a"b`},
		{"order", "a,b"}, {"order", strings.Repeat("x", 250)}, {"order", "a\nb"},
	} {
		_, err := idem.DownstreamKey(tc[0], tc[1])
		require.Error(t, err, tc)
	}
}

// The caller hanging up does not cancel the work, which keeps its deadline
// and stores its answer, and the caller's values.
func TestWorkOutlivesTheCaller(t *testing.T) {
	type key struct{}
	for _, strategy := range []string{"table", "hybrid-miniredis"} {
		t.Run("strategy="+strategy, func(t *testing.T) {
			b := setup(t, strategy, func(o *setupOpts) { o.cfg.WorkTimeout = 20 * time.Second })
			ctx, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "caller's"))
			r := req("u", newKey(), "x")
			_, out, err := b.guard.Do(ctx, r, func(wctx context.Context) (idem.Response, error) {
				cancel()
				require.NoError(t, wctx.Err(), "the caller's cancellation must not reach the work")
				require.Equal(t, "caller's", wctx.Value(key{}), "the work keeps the caller's values")
				_, ok := wctx.Deadline()
				require.True(t, ok, "detached work keeps its deadline")
				return created("detached"), nil
			})
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeExecuted, out)
		})
	}
}
