package pgidem_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/clock"
	"github.com/idemguard/idem/internal/testdb"
	"github.com/idemguard/idem/internal/testredis"
	"github.com/idemguard/idem/lock"
	"github.com/idemguard/idem/pgidem"
	"github.com/idemguard/idem/reconcile"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// bundle is a migrated schema of the test's own, and, with Redis, a client
// and a key prefix of its own.
type bundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	schema string
	rdb    redis.UniversalClient // nil: the table strategy
	prefix string
	table  string // quoted and qualified

	results chan reconcile.Result // every reconcile run
	sweeps  chan int64            // every sweep run's deleted rows
}

func setup(t *testing.T, withRedis bool) *bundle {
	t.Helper()
	pool := testdb.Pool(t)
	b := &bundle{
		ctx: t.Context(), pool: pool, schema: testdb.SchemaName(t, pool),
		results: make(chan reconcile.Result, 100), sweeps: make(chan int64, 100),
	}
	b.table = pgx.Identifier{b.schema, durable.DefaultTable}.Sanitize()
	require.NoError(t, durable.Migrate(b.ctx, pool, &durable.Config{Schema: b.schema}))
	if withRedis {
		c := testredis.Client(t)
		b.rdb, b.prefix = c, testredis.Prefix(t, c)
	}
	return b
}

// config is a Config over b's schema and prefix that reports every run of
// the reconciler and the sweeper on b's channels.
func (b *bundle) config() *pgidem.Config {
	c := &pgidem.Config{
		Store: &durable.Config{Schema: b.schema, AdmissionWait: time.Minute},
		Guard: &idem.Config{Logger: quiet()},
		Reconcile: &reconcile.Config{OnResult: func(res reconcile.Result, _ time.Duration, err error) {
			if err == nil {
				b.results <- res
			}
		}},
		Sweep: &durable.SweeperConfig{OnSweep: func(deleted int64, _ time.Duration, err error) {
			if err == nil {
				b.sweeps <- deleted
			}
		}},
	}
	if b.rdb != nil {
		c.Lock = &lock.Config{Prefix: b.prefix}
	}
	return c
}

// age moves a row's claim and deadline back by, as if it had been claimed
// that long ago.
func (b *bundle) age(t *testing.T, scope, key string, by string) {
	t.Helper()
	tag, err := b.pool.Exec(b.ctx, `UPDATE `+b.table+` SET created_at = created_at - $3::interval,
		hold_until = hold_until - $3::interval WHERE user_id = $1 AND key = $2`, scope, key, by)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
}

// seedExpired writes an answered row whose retention ended an hour ago.
func (b *bundle) seedExpired(t *testing.T, scope, key string) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO `+b.table+` (user_id, key, request_hash, owner_token, response_status, response_headers,
	response_body, created_at, completed_at, hold_until, retention)
VALUES ($1, $2, sha256('x'), decode(md5('x'), 'hex'), 201, '{}', '', now() - interval '25 hours', now() - interval '25 hours',
	now() - interval '25 hours', interval '24 hours')`,
		scope, key)
	require.NoError(t, err)
}

func (b *bundle) rows(t *testing.T, scope string) (n int) {
	t.Helper()
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM `+b.table+` WHERE user_id = $1`, scope).Scan(&n))
	return n
}

func created(id string) idem.Response {
	return idem.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Location": {"/orders/" + id}},
		Body:   []byte(`{"id":"` + id + `"}`),
	}
}

func bearer(r *http.Request) (string, bool) {
	return strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
}

func post(h http.Handler, key string) *http.Response {
	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"sku":"A1"}`))
	req.Header.Set("Authorization", "Bearer user-1")
	req.Header.Set(idem.HeaderKey, key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w.Result()
}

func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("no %s within 30s", what)
		panic("unreachable")
	}
}

func forEachRedis(t *testing.T, fn func(t *testing.T, withRedis bool)) {
	for _, withRedis := range []bool{false, true} {
		name := "redis=none"
		if withRedis {
			name = "redis=real"
		}
		t.Run(name, func(t *testing.T) { fn(t, withRedis) })
	}
}

// TestRunSettlesAndSweeps: the reconciler and the sweeper that Run starts
// settle a key a 504 left in progress (a retry then replays the real answer) and
// delete a row past its retention.
func TestRunSettlesAndSweeps(t *testing.T) {
	forEachRedis(t, func(t *testing.T, withRedis bool) {
		t.Parallel()
		b := setup(t, withRedis)
		const key = "8e03978e-pending"
		var resolved atomic.Int32
		resolve := func(_ context.Context, it reconcile.Item) (reconcile.Decision, error) {
			resolved.Add(1)
			if it.Key != key {
				return reconcile.Decision{}, nil
			}
			return reconcile.Decision{Verdict: reconcile.Settled, Response: created("o1")}, nil
		}
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
		cfg := b.config()
		cfg.Guard.MeterProvider = mp
		svc, err := pgidem.New(b.pool, b.rdb, resolve, cfg)
		require.NoError(t, err)
		if withRedis {
			require.Equal(t, "hybrid", svc.Guard().Strategy())
		} else {
			require.Equal(t, "table", svc.Guard().Strategy())
		}
		var runs atomic.Int32
		h := svc.Middleware(bearer, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			http.Error(w, "payment timed out", http.StatusGatewayTimeout)
		}))
		require.Equal(t, http.StatusGatewayTimeout, post(h, key).StatusCode)
		b.age(t, "user-1", key, "2 minutes")
		if !withRedis {
			// Pending: the Retry-After the reconciler's settings give,
			// MinAge 1m - MaxHold 46.5s + Interval 30s, plus its jitter.
			resp := post(h, key)
			require.Equal(t, http.StatusConflict, resp.StatusCode)
			secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
			require.NoError(t, err)
			require.Equal(t, 43500*time.Millisecond, svc.RetryHints().Pending)
			require.GreaterOrEqual(t, secs, 44)
			require.LessOrEqual(t, secs, 44+9)
		}
		b.seedExpired(t, "old", "k1")

		// The row aged on the database's clock is as old on the reconciler's.
		ctx, cancel := context.WithCancel(clock.WithHeadStart(b.ctx, time.Hour))
		stopped := make(chan error, 1)
		go func() { stopped <- svc.Run(ctx) }()
		require.Equal(t, reconcile.Result{Settled: 1}, receive(t, b.results, "reconcile run"))
		require.EqualValues(t, 1, receive(t, b.sweeps, "sweep run"))
		require.Zero(t, b.rows(t, "old"))

		resp := post(h, key)
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		require.Equal(t, "true", resp.Header.Get(idem.HeaderReplayed))
		require.Equal(t, "/orders/o1", resp.Header.Get("Location"))
		require.EqualValues(t, 1, runs.Load(), "the handler ran once")
		require.EqualValues(t, 1, resolved.Load())
		require.EqualValues(t, 1, svc.Guard().Stats().Settled)

		// One MeterProvider: the Guard's, the reconciler's and the sweeper's
		// figures.
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(b.ctx, &rm))
		sums := map[string]int64{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if d, ok := m.Data.(metricdata.Sum[int64]); ok {
					for _, p := range d.DataPoints {
						sums[m.Name] += p.Value
					}
				}
			}
		}
		require.Positive(t, sums[idem.MetricEvents])
		require.EqualValues(t, 1, sums["idem.reconcile.keys"])
		require.Positive(t, sums["idem.reconcile.runs"])
		require.EqualValues(t, 1, sums["idem.sweep.deleted"])
		require.Positive(t, sums["idem.sweep.runs"])

		cancel()
		require.NoError(t, receive(t, stopped, "Run's return"))
	})
}

// TestRunWakesWaiters: with Config.Wait, Run keeps the Listener behind the
// Guard, so a retry that finds its key running waits for the answer instead
// of a 409; a retry that began to wait before Run listened is handed over to
// the Listener.
func TestRunWakesWaiters(t *testing.T) {
	forEachRedis(t, func(t *testing.T, withRedis bool) {
		for _, early := range []bool{false, true} {
			t.Run("waiting before Run="+strconv.FormatBool(early), func(t *testing.T) {
				t.Parallel()
				testWakesWaiters(t, withRedis, early)
			})
		}
	})
}

func testWakesWaiters(t *testing.T, withRedis, early bool) {
	b := setup(t, withRedis)
	cfg := b.config()
	cfg.Store.Notify = true
	cfg.Wait = 20 * time.Second
	svc, err := pgidem.New(b.pool, b.rdb, func(context.Context, reconcile.Item) (reconcile.Decision, error) {
		return reconcile.Decision{}, nil
	}, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	stopped := make(chan error, 1)
	if !early {
		go func() { stopped <- svc.Run(ctx) }()
	}

	req := idem.Request{Scope: "user-1", Key: "k-wait", Fingerprint: idem.HashParts([]byte("a"))}
	running, finish := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, _, err := svc.Guard().Do(b.ctx, req, func(context.Context) (idem.Response, error) {
			close(running)
			<-finish
			return created("w1"), nil
		})
		first <- err
	}()
	<-running
	type result struct {
		resp idem.Response
		out  idem.Outcome
		err  error
	}
	retry := make(chan result, 1)
	go func() {
		resp, out, err := svc.Guard().Do(b.ctx, req, func(context.Context) (idem.Response, error) {
			return idem.Response{}, errors.New("the retry must not run")
		}, idem.WaitFor(cfg.Wait))
		retry <- result{resp, out, err}
	}()
	// The retry was refused once, subscribed, and was refused again by
	// its first re-read: it now waits for a wake-up.
	require.Eventually(t, func() bool { return svc.Guard().Stats().InProgress >= 2 }, 10*time.Second, time.Millisecond)
	if early {
		go func() { stopped <- svc.Run(ctx) }()
		// Handed over: woken once Run listens, it re-reads and waits on.
		require.Eventually(t, func() bool { return svc.Guard().Stats().InProgress >= 3 }, 10*time.Second, time.Millisecond)
	}
	close(finish)
	require.NoError(t, receive(t, first, "the first request"))
	r := receive(t, retry, "the retry")
	require.NoError(t, r.err)
	require.Equal(t, idem.OutcomeReplayed, r.out)
	require.Equal(t, "/orders/w1", r.resp.Header.Get("Location"))
	require.EqualValues(t, 1, svc.Guard().Stats().Waited)
	require.Zero(t, svc.Guard().Stats().WaitTimeouts)

	cancel()
	require.NoError(t, receive(t, stopped, "Run's return"))
}

// TestRunStops is not parallel: goleak looks at every goroutine. Run returns
// nil once its ctx ends, leaving no goroutine behind, and runs only once.
func TestRunStops(t *testing.T) {
	forEachRedis(t, func(t *testing.T, withRedis bool) {
		b := setup(t, withRedis)
		cfg := b.config()
		cfg.Store.Notify = true
		cfg.Wait = time.Second // a Listener too
		svc, err := pgidem.New(b.pool, b.rdb, func(context.Context, reconcile.Item) (reconcile.Decision, error) {
			return reconcile.Decision{}, nil
		}, cfg)
		require.NoError(t, err)
		// Warm the pools, so that their connections exist before the
		// snapshot.
		require.Zero(t, b.rows(t, "none"))
		if b.rdb != nil {
			require.NoError(t, b.rdb.Ping(b.ctx).Err())
		}
		leaks := goleak.IgnoreCurrent()

		ctx, cancel := context.WithCancel(b.ctx)
		stopped := make(chan error, 1)
		go func() { stopped <- svc.Run(ctx) }()
		receive(t, b.results, "reconcile run")
		receive(t, b.sweeps, "sweep run")
		require.ErrorContains(t, svc.Run(ctx), "pgidem: Service.Run called more than once")
		cancel()
		require.NoError(t, receive(t, stopped, "Run's return"))
		goleak.VerifyNone(t, leaks)
		require.ErrorContains(t, svc.Run(b.ctx), "more than once", "Run runs once, even after it returned")
	})
}

// TestNewRefusesMisconfigurations: a setup that would misbehave later fails
// at New, with an error naming the field. New contacts no server, so these
// run without them.
func TestNewRefusesMisconfigurations(t *testing.T) {
	t.Parallel()
	pool := &pgxpool.Pool{}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	resolve := func(context.Context, reconcile.Item) (reconcile.Decision, error) { return reconcile.Decision{}, nil }
	tests := []struct {
		name string
		rdb  redis.UniversalClient
		cfg  *pgidem.Config
		err  string
	}{
		{name: "wait without notifications", cfg: &pgidem.Config{Wait: 5 * time.Second},
			err: "pgidem: Config.Wait 5s needs Config.Store.Notify"},
		{name: "negative wait", cfg: &pgidem.Config{Wait: -time.Second}, err: "pgidem: Config.Wait -1s must not be negative"},
		{name: "wait past MaxHold", cfg: &pgidem.Config{Wait: time.Minute, Store: &durable.Config{Notify: true}},
			err: "pgidem: Config.Wait 1m0s must be shorter than the Guard's MaxHold 46.5s"},
		{name: "retention a pending key could outlive", cfg: &pgidem.Config{Store: &durable.Config{Retention: 80 * time.Second}},
			err: "pgidem: Config.Reconcile: reconcile: Config.MinAge 1m0s + Config.Interval 30s: must be shorter than the store's retention 1m20s"},
		{name: "retention a client told to come back could outlive", cfg: &pgidem.Config{
			Store:     &durable.Config{Retention: 650 * time.Second},
			Reconcile: &reconcile.Config{MinAge: 10 * time.Minute, Interval: 10 * time.Second},
		}, err: "pgidem: Config.Store.Retention 10m50s must be longer than the longest Retry-After of a pending key, 11m17s"},
		{name: "retention a running key could outlive", cfg: &pgidem.Config{Store: &durable.Config{Retention: 40 * time.Second}},
			err: "pgidem: Config.Guard: idem: the store's retention 40s must be longer than the Guard's MaxHold"},
		{name: "reconciler younger than MaxHold", cfg: &pgidem.Config{Reconcile: &reconcile.Config{MinAge: 30 * time.Second}},
			err: "pgidem: Config.Reconcile: reconcile: Config.MinAge 30s: must be longer than the Guard's MaxHold 46.5s"},
		{name: "lock by hand", cfg: &pgidem.Config{Guard: &idem.Config{Lock: &lock.Locker{}}}, err: "pgidem: Config.Guard.Lock must be nil"},
		{name: "waiter by hand", cfg: &pgidem.Config{Guard: &idem.Config{Waiter: &durable.Listener{}}}, err: "pgidem: Config.Guard.Waiter must be nil"},
		{name: "lock config without Redis", cfg: &pgidem.Config{Lock: &lock.Config{}}, err: "pgidem: Config.Lock is set but New has no Redis client"},
		{name: "typed nil Redis client", rdb: (*redis.Client)(nil), cfg: &pgidem.Config{Lock: &lock.Config{}}, err: "pgidem: Config.Lock is set but New has no Redis client"},
		{name: "invalid lock", rdb: rdb, cfg: &pgidem.Config{Lock: &lock.Config{TTL: 1500 * time.Millisecond}}, err: "pgidem: Config.Lock: lock: Config.TTL 1.5s"},
		{name: "invalid store", cfg: &pgidem.Config{Store: &durable.Config{Schema: "Bad-Name"}}, err: "pgidem: Config.Store: durable: Config.Schema"},
		{name: "invalid sweeper", cfg: &pgidem.Config{Sweep: &durable.SweeperConfig{Interval: -time.Second}}, err: "pgidem: Config.Sweep: durable: SweeperConfig.Interval"},
		{name: "a second MeterProvider", cfg: &pgidem.Config{Reconcile: &reconcile.Config{MeterProvider: noopProvider()}},
			err: "pgidem: Config.Reconcile.MeterProvider must be nil"},
		{name: "a sweeper's MeterProvider", cfg: &pgidem.Config{Sweep: &durable.SweeperConfig{MeterProvider: noopProvider()}},
			err: "pgidem: Config.Sweep.MeterProvider must be nil"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := pgidem.New(pool, tt.rdb, resolve, tt.cfg)
			require.ErrorContains(t, err, tt.err)
			require.NotContains(t, err.Error(), "\n", "one line")
		})
	}

	_, err := pgidem.New(nil, nil, resolve, nil)
	require.ErrorContains(t, err, "pgidem: nil pool")
	_, err = pgidem.New(pool, nil, nil, nil)
	require.ErrorContains(t, err, "pgidem: nil ResolveFunc")

	// Valid: a nil Config, the hybrid, waiting with notifications.
	for _, c := range []struct {
		rdb redis.UniversalClient
		cfg *pgidem.Config
	}{
		{nil, nil},
		{rdb, nil},
		{rdb, &pgidem.Config{Lock: &lock.Config{Prefix: "p:"}, Wait: 5 * time.Second, Store: &durable.Config{Notify: true}}},
	} {
		svc, err := pgidem.New(pool, c.rdb, resolve, c.cfg)
		require.NoError(t, err)
		require.NotNil(t, svc.Guard())
		require.Equal(t, 43500*time.Millisecond, svc.RetryHints().Pending, "MinAge 1m - MaxHold 46.5s + Interval 30s")
	}
}

func noopProvider() metric.MeterProvider { return noop.NewMeterProvider() }

// TestShutdown: Shutdown stops Run and returns once the answers' copies are
// in Redis; requests after it still run once, without the lease; a Run
// started after it starts nothing.
func TestShutdown(t *testing.T) {
	forEachRedis(t, func(t *testing.T, withRedis bool) {
		t.Parallel()
		b := setup(t, withRedis)
		svc, err := pgidem.New(b.pool, b.rdb, func(context.Context, reconcile.Item) (reconcile.Decision, error) {
			return reconcile.Decision{}, nil
		}, b.config())
		require.NoError(t, err)
		stopped := make(chan error, 1)
		go func() { stopped <- svc.Run(b.ctx) }()
		receive(t, b.results, "reconcile run")

		var runs atomic.Int32
		h := svc.Middleware(bearer, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.WriteHeader(http.StatusCreated)
		}))
		require.Equal(t, http.StatusCreated, post(h, "k-before").StatusCode)
		require.NoError(t, svc.Shutdown(b.ctx))
		require.NoError(t, receive(t, stopped, "Run's return"), "Shutdown stopped Run")
		early, err := pgidem.New(b.pool, b.rdb, func(context.Context, reconcile.Item) (reconcile.Decision, error) {
			return reconcile.Decision{}, nil
		}, b.config())
		require.NoError(t, err)
		require.NoError(t, early.Shutdown(b.ctx))
		require.NoError(t, early.Run(b.ctx), "a Run after Shutdown starts nothing and returns")
		if withRedis {
			l, err := lock.New(b.rdb, &lock.Config{Prefix: b.prefix})
			require.NoError(t, err)
			n, err := b.rdb.Exists(b.ctx, l.Key("user-1", "k-before")).Result()
			require.NoError(t, err)
			require.EqualValues(t, 1, n, "the copy is in Redis once Shutdown returned")
		}
		require.Equal(t, http.StatusCreated, post(h, "k-after").StatusCode)
		require.Equal(t, "true", post(h, "k-after").Header.Get(idem.HeaderReplayed))
		require.EqualValues(t, 2, runs.Load())
		require.NoError(t, svc.Shutdown(b.ctx), "a second Shutdown")
	})
}
