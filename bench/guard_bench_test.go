package main_test

// Microbenchmarks of idem: every path of the Guard under both strategies
// against real PostgreSQL and Redis, the middleware alone over in-memory
// stores, and closed-loop throughput of the guard against the ceiling of its
// own statements and of the ceiling against the minimal SQL.
//
//	go test -run '^$' -bench . -benchtime 2s ./bench
//
// They need PostgreSQL at $TEST_DATABASE_URL and Redis at $TEST_REDIS_ADDR
// (local defaults), like the library's tests, and are skipped without them
// (failed under CI=true).

import (
	"bytes"
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/bench/internal/fixture"
	"github.com/idemguard/idem/bench/internal/target"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/idemtest"
	"github.com/idemguard/idem/internal/testdb"
	"github.com/idemguard/idem/internal/testredis"
	"github.com/idemguard/idem/lock"
)

var (
	answer = idem.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/ord_0123456789"}},
		Body:   []byte(`{"id":"ord_0123456789","status":"confirmed","amount":4200,"currency":"EUR"}`),
	}
	work = func(context.Context) (idem.Response, error) { return answer, nil }

	discard = slog.New(slog.DiscardHandler)
)

// rig is a guard over a real store whose round trips are counted.
type rig struct {
	guard  *idem.Guard
	store  *durable.Store
	locker *lock.Locker  // nil in table mode
	pool   *pgxpool.Pool // the store's pool, not counted: for preparing rows
	pg     *fixture.CountingDB
	redis  *fixture.RedisCounter
	syncs  int64 // DELs of redisCount, not the guard's
}

func newRig(tb testing.TB, strategy string) *rig {
	tb.Helper()
	store, pool := testdb.Store(tb, nil)
	r := &rig{pool: pool, pg: fixture.NewCountingDB(pool), redis: &fixture.RedisCounter{}}
	r.store = store.WithDB(r.pg)
	cfg := &idem.Config{Logger: discard}
	if strategy == target.Hybrid {
		rdb := testredis.Client(tb)
		rdb.AddHook(r.redis)
		l, err := lock.New(rdb, &lock.Config{Prefix: testredis.Prefix(tb, rdb)})
		if err != nil {
			tb.Fatal(err)
		}
		r.locker, cfg.Lock = l, l
	}
	g, err := idem.New(r.store, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	r.guard = g
	return r
}

// redisCount is the number of Redis commands the guard has sent, once every
// command it queued has gone: the answer's copy does not wait (Locker.Set),
// so a round trip through the Locker (a DEL of a key nobody uses, not
// counted) follows it first.
func (r *rig) redisCount(tb testing.TB) int64 {
	if r.locker == nil {
		return r.redis.Count()
	}
	if err := r.locker.Delete(tb.Context(), "sync", "sync"); err != nil {
		tb.Fatal(err)
	}
	r.syncs++
	return r.redis.Count() - r.syncs
}

func request(key string) idem.Request {
	return idem.Request{Scope: "user-42", Key: key, Fingerprint: sha256.Sum256([]byte(key))}
}

// path prepares the state of one path and returns the request to send, or
// a function that returns a new one per iteration.
type path struct {
	name    string
	outcome idem.Outcome
	prepare func(tb testing.TB, r *rig) func(i int) idem.Request
}

var paths = []path{
	{"first_execution", idem.OutcomeExecuted, func(tb testing.TB, r *rig) func(int) idem.Request {
		return func(i int) idem.Request { return request("first-" + strconv.Itoa(i)) }
	}},
	{"replay", idem.OutcomeReplayed, func(tb testing.TB, r *rig) func(int) idem.Request {
		req := request("replay")
		if _, out, err := r.guard.Do(tb.Context(), req, work); err != nil || out != idem.OutcomeExecuted {
			tb.Fatalf("prepare: %v %v", out, err)
		}
		return func(int) idem.Request { return req }
	}},
	{"in_progress", idem.OutcomeInProgress, func(tb testing.TB, r *rig) func(int) idem.Request {
		req := request("in-progress")
		// Another request runs the work: it holds the claim and, in hybrid
		// mode, the lease, until the benchmark ends.
		started, finish := make(chan struct{}), make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _, _ = r.guard.Do(context.WithoutCancel(tb.Context()), req, func(context.Context) (idem.Response, error) {
				close(started)
				<-finish
				return idem.Response{Status: 201}, nil
			})
		}()
		<-started
		tb.Cleanup(func() { close(finish); <-done })
		return func(int) idem.Request { return req }
	}},
	{"key_reused", idem.OutcomeKeyReused, func(tb testing.TB, r *rig) func(int) idem.Request {
		req := request("reused")
		if _, _, err := r.guard.Do(tb.Context(), req, work); err != nil {
			tb.Fatal(err)
		}
		req.Fingerprint[0] ^= 0xff
		return func(int) idem.Request { return req }
	}},
	{"expired_key", idem.OutcomeExecuted, func(tb testing.TB, r *rig) func(int) idem.Request {
		// Keys reused after their retention, before the sweeper's pass:
		// each request finds the answered row of an earlier intent, 25
		// hours old, and is a new intent. The rows are inserted 1,000 at a
		// time, outside the counted store, as the requests reach them.
		return func(i int) idem.Request {
			if i%1000 == 0 {
				_, err := r.pool.Exec(tb.Context(), `
INSERT INTO `+r.store.Table()+` (user_id, key, request_hash, owner_token, response_status,
	response_headers, response_body, created_at, completed_at, hold_until, retention)
SELECT 'user-42', 'expired-' || g, sha256(('expired-' || g)::bytea), decode(md5(g::text), 'hex'), 201,
	'{}', '', now() - interval '25 hours', now() - interval '25 hours', now() - interval '25 hours', interval '24 hours'
FROM generate_series($1::int, $1::int + 999) AS g`, i)
				if err != nil {
					tb.Fatal(err)
				}
			}
			return request("expired-" + strconv.Itoa(i))
		}
	}},
	{"missing_key", idem.OutcomeNone, func(tb testing.TB, r *rig) func(int) idem.Request {
		req := request("")
		req.Key = ""
		return func(int) idem.Request { return req }
	}},
}

// BenchmarkGuard times Guard.Do on each path, against real servers, and
// reports the PostgreSQL round trips and Redis commands of each.
func BenchmarkGuard(b *testing.B) {
	for _, strategy := range []string{target.Table, target.Hybrid} {
		for _, p := range paths {
			b.Run("strategy="+strategy+"/path="+p.name, func(b *testing.B) {
				r := newRig(b, strategy)
				next := p.prepare(b, r)
				ctx := b.Context()
				pg0, rd0 := r.pg.Count(), r.redisCount(b)
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					_, out, _ := r.guard.Do(ctx, next(i), work)
					if out != p.outcome {
						b.Fatalf("outcome %v, want %v", out, p.outcome)
					}
					i++
				}
				b.ReportMetric(float64(r.pg.Count()-pg0)/float64(b.N), "pg-roundtrips/op")
				b.ReportMetric(float64(r.redisCount(b)-rd0)/float64(b.N), "redis-cmds/op")
			})
		}
	}
}

// writer is a reusable http.ResponseWriter that keeps nothing, so that the
// benchmark times the middleware, not a recorder.
type writer struct {
	h      http.Header
	status int
	n      int
}

func (w *writer) Header() http.Header         { return w.h }
func (w *writer) WriteHeader(code int)        { w.status = code }
func (w *writer) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }
func (w *writer) reset()                      { clear(w.h); w.status, w.n = 0, 0 }

var (
	contentType = []string{"application/json"}
	location    = []string{"/orders/ord_0123456789"}
)

// handler is the application behind the middleware: it sets two headers
// and writes the body without allocating, so what the benchmark counts is
// the middleware's.
var handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h["Content-Type"] = contentType
	h["Location"] = location
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(answer.Body)
})

// BenchmarkMiddleware times the HTTP middleware alone, over in-memory
// stores, so no store I/O is included:
//
//   - store=null: a fixture that keeps nothing (every claim wins), the same
//     key every iteration: the middleware's own cost, no bookkeeping at all;
//   - store=fixture: the benchmark fixture holding the key in the state the
//     path needs (a finished answer, a running claim, another fingerprint);
//   - store=idemtest: idemtest.MemStore, the real in-memory idem.Store that
//     users test with, and a distinct key every iteration, so each first
//     execution claims a new row, encodes and stores its answer, and the
//     map grows. It includes one allocation of the benchmark's own: the key
//     string, which net/http's header parsing would allocate too.
//
// path=bare is the handler without the middleware: subtract it to get the
// middleware's own cost.
func BenchmarkMiddleware(b *testing.B) {
	body := []byte(`{"hold_ids":[88211,88212],"payment_method":"pm_card_visa"}`)
	scope := func(*http.Request) (string, bool) { return "user-42", true }
	fp := idem.HashRequest(http.MethodPost, "/orders", body)
	finished := func(key string, f idem.Fingerprint, a *idem.Response) idem.Record {
		return idem.Record{Scope: "user-42", Key: key, Fingerprint: f, Owner: idem.Token{1}, Answer: a}
	}
	stored := answer
	other := fp
	other[0] ^= 0xff
	null := func() idem.Store { return fixture.NewNullStore() }
	cases := []struct {
		store, name  string
		newStore     func() idem.Store
		key          string // "": no key; distinct: a new key every iteration
		distinctKeys bool
		status       int
		bare         bool
	}{
		{store: "null", name: "bare", newStore: null, key: "k", status: http.StatusCreated, bare: true},
		{store: "null", name: "first_execution", newStore: null, key: "k", status: http.StatusCreated},
		{store: "idemtest", name: "first_execution", distinctKeys: true, status: http.StatusCreated,
			newStore: func() idem.Store { return idemtest.NewMemStore(nil) }},
		{store: "fixture", name: "replay", key: "replay", status: http.StatusCreated, newStore: func() idem.Store {
			s := fixture.NewMemStore()
			s.Put(finished("replay", fp, &stored))
			return s
		}},
		{store: "fixture", name: "in_progress", key: "busy", status: http.StatusConflict, newStore: func() idem.Store {
			s := fixture.NewMemStore()
			s.Put(finished("busy", fp, nil))
			return s
		}},
		{store: "fixture", name: "key_reused", key: "reused", status: http.StatusUnprocessableEntity, newStore: func() idem.Store {
			s := fixture.NewMemStore()
			s.Put(finished("reused", other, &stored))
			return s
		}},
		{store: "null", name: "missing_key", key: "", status: http.StatusBadRequest, newStore: null},
	}
	for _, c := range cases {
		b.Run("strategy=table/store="+c.store+"/path="+c.name, func(b *testing.B) {
			g, err := idem.New(c.newStore(), &idem.Config{Logger: discard})
			if err != nil {
				b.Fatal(err)
			}
			h := http.Handler(handler)
			if !c.bare {
				h = g.Middleware(scope, nil)(handler)
			}
			rd := bytes.NewReader(body)
			req, err := http.NewRequestWithContext(b.Context(), http.MethodPost, "/orders", io.NopCloser(rd))
			if err != nil {
				b.Fatal(err)
			}
			req.RequestURI = "/orders"
			req.ContentLength = int64(len(body))
			keyValue := []string{c.key}
			if c.key != "" || c.distinctKeys {
				req.Header[http.CanonicalHeaderKey(idem.HeaderKey)] = keyValue
			}
			var keyBuf []byte
			w := &writer{h: http.Header{}}
			b.ReportAllocs()
			i := int64(0)
			for b.Loop() {
				if c.distinctKeys {
					keyBuf = strconv.AppendInt(keyBuf[:0], i, 36)
					keyValue[0] = string(keyBuf)
					i++
				}
				rd.Reset(body)
				w.reset()
				h.ServeHTTP(w, req)
				if w.status != c.status {
					b.Fatalf("status %d, want %d", w.status, c.status)
				}
			}
		})
	}
}

// Flags of BenchmarkThroughput, after the package on the go test command
// line (go test passes them to the test binary).
var (
	throughputRounds = flag.Int("throughput-rounds", 10, "BenchmarkThroughput: ABBA rounds per strategy and concurrency (at least 5)")
	throughputRun    = flag.Duration("throughput-run", time.Second, "BenchmarkThroughput: how long each implementation runs per round")
)

// BenchmarkThroughput compares, closed loop, the first executions (no
// handler latency) per second of conc concurrent callers through the guard,
// the ceiling (the guard's own statements and commands issued directly with
// pgx and go-redis) and the minimal target (the least SQL that does the job,
// on a minimal table), and reports the ratios guard / ceiling (the guard's Go
// overhead) and ceiling / minimal (the store's SQL and schema against the
// bare job). The targets are both ratios >= 0.9 at 8 and 32 callers.
//
// A single pair of runs is not a measurement on a machine shared with the
// servers: each strategy and concurrency runs -throughput-rounds rounds
// (default 10: a single round lands anywhere from 0.7 to 1.1 on a 2-core
// machine, and the median of 6 moved by 0.03 between runs) of the three
// implementations, each for -throughput-run
// (default 1s) on a freshly truncated table, in ABBA order: minimal, ceiling,
// guard in even rounds and guard, ceiling, minimal in odd ones, so that the
// ceiling is run right beside each of the others, before it as often as
// after it, and a drift during the benchmark hits both sides of a ratio
// alike. Each round gives one ratio of each kind; the benchmark reports
// their median and their spread (min and max), the median ops/s of each
// implementation, and its allocations per operation (the whole process,
// load driver included). b.N is ignored: one invocation is the whole
// measurement, so run it once per -count:
//
//	go test -run '^$' -bench Throughput -benchtime 1x ./bench
//	go test -run '^$' -bench Throughput -benchtime 1x ./bench -throughput-rounds 20 -throughput-run 2s
//
// The per-round figures are logged (printed under the benchmark's line).
func BenchmarkThroughput(b *testing.B) {
	impls := []string{target.Minimal, target.Ceiling, target.Guard}
	for _, strategy := range []string{target.Table, target.Hybrid} {
		for _, conc := range []int{8, 32} {
			b.Run("strategy="+strategy+"/conc="+strconv.Itoa(conc), func(b *testing.B) {
				rounds, runFor := *throughputRounds, *throughputRun
				if rounds < 5 || runFor <= 0 {
					b.Fatalf("-throughput-rounds %d must be at least 5 and -throughput-run %v positive", rounds, runFor)
				}
				pool := testdb.Pool(b) // skips (or fails under CI) without PostgreSQL
				pool.Close()
				testredis.Client(b)
				ctx := b.Context()
				env, err := target.Open(ctx, target.Config{
					DatabaseURL: testdb.URL(), RedisAddr: testredis.Addr(), PoolSize: conc, RedisPoolSize: conc,
				})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = env.Close(context.Background()) })
				targets := make([]target.Target, len(impls))
				for i, impl := range impls {
					if targets[i], err = target.New(env, strategy, impl, 0); err != nil {
						b.Fatal(err)
					}
				}
				var seq atomic.Int64 // keys stay unique across runs: Redis keeps the leases
				run := func(t target.Target, d time.Duration) (opsPerSec, allocsPerOp float64) {
					if err := env.Truncate(ctx, t.Table()); err != nil {
						b.Fatal(err)
					}
					n, mallocs, elapsed, err := closedLoop(ctx, t, conc, d, &seq)
					if err != nil {
						b.Fatal(err)
					}
					return float64(n) / elapsed.Seconds(), float64(mallocs) / float64(max(n, 1))
				}
				for _, t := range targets { // dial the pools, load the scripts
					run(t, runFor/4)
				}
				ops := make([][]float64, len(impls))
				allocs := make([][]float64, len(impls))
				for round := range rounds {
					order := []int{0, 1, 2}
					if round%2 == 1 {
						slices.Reverse(order)
					}
					for _, i := range order {
						o, a := run(targets[i], runFor)
						ops[i], allocs[i] = append(ops[i], o), append(allocs[i], a)
					}
				}
				minimal, ceiling, guard := ops[0], ops[1], ops[2]
				gc, cm := make([]float64, rounds), make([]float64, rounds)
				for r := range rounds {
					gc[r], cm[r] = guard[r]/ceiling[r], ceiling[r]/minimal[r]
					b.Logf("round %d: ops/s minimal %.0f, ceiling %.0f, guard %.0f; guard/ceiling %.3f, ceiling/minimal %.3f",
						r+1, minimal[r], ceiling[r], guard[r], gc[r], cm[r])
				}
				b.ReportMetric(0, "ns/op") // one invocation is the whole measurement: time per b.N means nothing
				for i, impl := range impls {
					b.ReportMetric(median(ops[i]), impl+"-ops/s")
					b.ReportMetric(median(allocs[i]), impl+"-allocs/op")
				}
				b.ReportMetric(median(gc), "guard/ceiling")
				b.ReportMetric(slices.Min(gc), "guard/ceiling-min")
				b.ReportMetric(slices.Max(gc), "guard/ceiling-max")
				b.ReportMetric(median(cm), "ceiling/minimal")
				b.ReportMetric(slices.Min(cm), "ceiling/minimal-min")
				b.ReportMetric(slices.Max(cm), "ceiling/minimal-max")
			})
		}
	}
}

// closedLoop runs first executions through t from conc callers for d, each
// calling again as soon as its call returns, and returns how many completed,
// the heap allocations of the whole process meanwhile, and the time from the
// start to the last completion.
func closedLoop(ctx context.Context, t target.Target, conc int, d time.Duration, seq *atomic.Int64) (n, mallocs int64, elapsed time.Duration, err error) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	mallocs0 := ms.Mallocs
	var (
		done    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
	)
	start := time.Now()
	deadline := start.Add(d)
	for range conc {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				k := seq.Add(1)
				key := "t" + strconv.FormatInt(k, 36)
				req := idem.Request{Scope: "user-" + strconv.FormatInt(k%1000, 10), Key: key,
					Fingerprint: sha256.Sum256([]byte(key))}
				out, e := t.Do(ctx, req)
				if e == nil && out != idem.OutcomeExecuted.String() {
					e = fmt.Errorf("outcome %s, want executed", out)
				}
				if e != nil {
					errOnce.Do(func() { err = e })
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed = time.Since(start)
	runtime.ReadMemStats(&ms)
	return done.Load(), int64(ms.Mallocs - mallocs0), elapsed, err
}

// median returns the median of xs (the mean of the two middle values for an
// even count), without changing xs.
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
