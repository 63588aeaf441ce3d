package main_test

// Microbenchmarks of idem: every path of the Guard under both strategies
// against real PostgreSQL and Redis, the middleware alone over an in-memory
// store, and closed-loop throughput of the guard against the ceiling of its
// own statements.
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
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/bench/internal/fixture"
	"github.com/idemguard/idem/bench/internal/target"
	"github.com/idemguard/idem/durable"
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
	locker *lock.Locker // nil in table mode
	pg     *fixture.CountingDB
	redis  *fixture.RedisCounter
}

func newRig(tb testing.TB, strategy string) *rig {
	tb.Helper()
	store, pool := testdb.Store(tb, nil)
	r := &rig{pg: fixture.NewCountingDB(pool), redis: &fixture.RedisCounter{}}
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
		// Another instance runs the work: it holds the claim and, in
		// hybrid mode, the lease.
		if r.locker != nil {
			if _, err := r.locker.Obtain(tb.Context(), req.Scope, req.Key); err != nil {
				tb.Fatal(err)
			}
		}
		_, _, err := r.store.Claim(tb.Context(), durable.ClaimParams{
			Scope: req.Scope, Key: req.Key, Fingerprint: req.Fingerprint, Owner: durable.Token{1}})
		if err != nil {
			tb.Fatal(err)
		}
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
				pg0, rd0 := r.pg.Count(), r.redis.Count()
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
				b.ReportMetric(float64(r.redis.Count()-rd0)/float64(b.N), "redis-cmds/op")
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

// BenchmarkMiddleware times the HTTP middleware alone: the store is the
// in-memory fixture (for first executions, one that keeps nothing), so no
// store I/O is included. path=bare is the handler without the middleware:
// subtract it to get the middleware's own cost.
func BenchmarkMiddleware(b *testing.B) {
	body := []byte(`{"hold_ids":[88211,88212],"payment_method":"pm_card_visa"}`)
	scope := func(*http.Request) (string, bool) { return "user-42", true }
	fp := idem.HashRequest(http.MethodPost, "/orders", body)
	finished := func(key string, f idem.Fingerprint, a *durable.Answer) durable.Record {
		return durable.Record{Scope: "user-42", Key: key, Fingerprint: f, Owner: durable.Token{1}, Answer: a}
	}
	stored := durable.Answer(answer)
	other := fp
	other[0] ^= 0xff
	cases := []struct {
		name   string
		store  func() *fixture.MemStore
		key    string
		status int
		bare   bool
	}{
		{name: "bare", store: fixture.NewNullStore, key: "k", status: http.StatusCreated, bare: true},
		{name: "first_execution", store: fixture.NewNullStore, key: "k", status: http.StatusCreated},
		{name: "replay", key: "replay", status: http.StatusCreated, store: func() *fixture.MemStore {
			s := fixture.NewMemStore()
			s.Put(finished("replay", fp, &stored))
			return s
		}},
		{name: "in_progress", key: "busy", status: http.StatusConflict, store: func() *fixture.MemStore {
			s := fixture.NewMemStore()
			s.Put(finished("busy", fp, nil))
			return s
		}},
		{name: "key_reused", key: "reused", status: http.StatusUnprocessableEntity, store: func() *fixture.MemStore {
			s := fixture.NewMemStore()
			s.Put(finished("reused", other, &stored))
			return s
		}},
		{name: "missing_key", key: "", status: http.StatusBadRequest, store: fixture.NewNullStore},
	}
	for _, c := range cases {
		b.Run("strategy=table/store=memory/path="+c.name, func(b *testing.B) {
			g, err := idem.New(c.store(), &idem.Config{Logger: discard})
			if err != nil {
				b.Fatal(err)
			}
			h := http.Handler(handler)
			if !c.bare {
				h = g.Middleware(scope)(handler)
			}
			rd := bytes.NewReader(body)
			req, err := http.NewRequestWithContext(b.Context(), http.MethodPost, "/orders", io.NopCloser(rd))
			if err != nil {
				b.Fatal(err)
			}
			req.RequestURI = "/orders"
			req.ContentLength = int64(len(body))
			if c.key != "" {
				req.Header.Set(idem.HeaderKey, c.key)
			}
			w := &writer{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
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

// ceilingRatios remembers each ceiling's ops/s for the guard run after it.
var ceilingRatios sync.Map // "strategy/conc" -> float64

// BenchmarkThroughput runs first executions (no handler latency) from conc
// concurrent callers, closed loop, through the guard and through the ceiling
// (the same statements and commands issued directly with pgx and go-redis),
// and reports ops/s; the guard's run also reports its ratio to the ceiling's
// when the ceiling ran just before it.
func BenchmarkThroughput(b *testing.B) {
	for _, strategy := range []string{target.Table, target.Hybrid} {
		for _, conc := range []int{8, 32} {
			for _, impl := range []string{target.Ceiling, target.Guard} {
				name := "strategy=" + strategy + "/conc=" + strconv.Itoa(conc) + "/impl=" + impl
				b.Run(name, func(b *testing.B) {
					pool := testdb.Pool(b) // skips (or fails under CI) without PostgreSQL
					pool.Close()
					testredis.Client(b)
					env, err := target.Open(b.Context(), target.Config{
						DatabaseURL: testdb.URL(), RedisAddr: testredis.Addr(), PoolSize: conc, RedisPoolSize: conc,
					})
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { _ = env.Close(context.Background()) })
					t, err := target.New(env, strategy, impl, 0)
					if err != nil {
						b.Fatal(err)
					}
					var seq atomic.Int64
					procs := runtime.GOMAXPROCS(0)
					b.SetParallelism((conc + procs - 1) / procs)
					b.ReportAllocs()
					b.ResetTimer()
					b.RunParallel(func(pb *testing.PB) {
						ctx := context.Background()
						for pb.Next() {
							n := seq.Add(1)
							key := "t" + strconv.FormatInt(n, 36)
							req := idem.Request{Scope: "user-" + strconv.FormatInt(n%1000, 10), Key: key,
								Fingerprint: sha256.Sum256([]byte(key))}
							if out, err := t.Do(ctx, req); err != nil || out != idem.OutcomeExecuted.String() {
								b.Errorf("%s: %v", out, err)
								return
							}
						}
					})
					ops := float64(b.N) / b.Elapsed().Seconds()
					b.ReportMetric(ops, "ops/s")
					key := strategy + "/" + strconv.Itoa(conc)
					if impl == target.Ceiling {
						ceilingRatios.Store(key, ops)
					} else if c, ok := ceilingRatios.Load(key); ok {
						b.ReportMetric(ops/c.(float64), "x-ceiling")
					}
				})
			}
		}
	}
}
