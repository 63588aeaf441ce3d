package main_test

// Microbenchmarks of idem: every path of the Guard under both strategies
// against real PostgreSQL and Redis, and the middleware alone over the
// in-memory store.
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
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"testing"

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
	// A Store reads the table's schema version once before its first
	// request (and once a minute after): done here, not counted.
	if _, err := store.Get(tb.Context(), "rig", "warm-up"); !errors.Is(err, idem.ErrNotFound) {
		tb.Fatal(err)
	}
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
	{"first_execution_claiming_first", idem.OutcomeExecuted, func(tb testing.TB, r *rig) func(int) idem.Request {
		// A window of 512 new keys without a duplicate: the hybrid claims first.
		for i := range 512 {
			if _, out, err := r.guard.Do(tb.Context(), request("window-"+strconv.Itoa(i)), work); err != nil || out != idem.OutcomeExecuted {
				tb.Fatalf("prepare: %v %v", out, err)
			}
		}
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
//
// A hybrid Guard claims first from its 513th request without a duplicate:
// at 500x, first_execution measures the lease first throughout.
//
//	go test -run '^$' -bench Guard -benchtime 500x ./bench
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

// BenchmarkMiddleware times the HTTP middleware alone over
// idemtest.MemStore, the in-memory idem.Store users test with, so no store
// I/O is included. Each path finds its key in the state it needs:
//
//   - first_execution: a distinct key every iteration, so each claims a new
//     row and encodes and stores its answer (one allocation is the
//     benchmark's own: the key string, which net/http's header parsing would
//     allocate too);
//   - replay: the key answered; in_progress: the key claimed by a request
//     that has not answered; key_reused: the key answered for another body;
//   - missing_key: no Idempotency-Key (400).
//
// path=bare is the handler without the middleware: subtract it to get the
// middleware's own cost.
//
//	go test -run '^$' -bench Middleware -count 5 ./bench
func BenchmarkMiddleware(b *testing.B) {
	body := []byte(`{"hold_ids":[88211,88212],"payment_method":"pm_card_visa"}`)
	scope := func(*http.Request) (string, bool) { return "user-42", true }
	fp := idem.HashRequest(http.MethodPost, "/orders", body)
	other := fp
	other[0] ^= 0xff
	// claim leaves key claimed under f by another request, answered unless
	// a is nil.
	claim := func(b *testing.B, s *idemtest.MemStore, g *idem.Guard, key string, f idem.Fingerprint, a *idem.Response) {
		p := idem.ClaimParams{Scope: "user-42", Key: key, Fingerprint: f, Owner: idem.Token{1}, Hold: g.MaxHold()}
		if _, ok, err := s.Claim(b.Context(), p); err != nil || !ok {
			b.Fatalf("claim: %v %v", ok, err)
		}
		if a != nil {
			if err := s.Complete(b.Context(), p.Scope, p.Key, p.Owner, *a); err != nil {
				b.Fatal(err)
			}
		}
	}
	cases := []struct {
		name     string
		key      string // "": no key
		distinct bool   // a new key every iteration
		prepare  func(b *testing.B, s *idemtest.MemStore, g *idem.Guard)
		status   int
		bare     bool
	}{
		{name: "bare", key: "k", status: http.StatusCreated, bare: true},
		{name: "first_execution", distinct: true, status: http.StatusCreated},
		{name: "replay", key: "replay", status: http.StatusCreated, prepare: func(b *testing.B, s *idemtest.MemStore, g *idem.Guard) {
			claim(b, s, g, "replay", fp, &answer)
		}},
		{name: "in_progress", key: "busy", status: http.StatusConflict, prepare: func(b *testing.B, s *idemtest.MemStore, g *idem.Guard) {
			claim(b, s, g, "busy", fp, nil)
		}},
		{name: "key_reused", key: "reused", status: http.StatusUnprocessableEntity, prepare: func(b *testing.B, s *idemtest.MemStore, g *idem.Guard) {
			claim(b, s, g, "reused", other, &answer)
		}},
		{name: "missing_key", status: http.StatusBadRequest},
	}
	for _, c := range cases {
		b.Run("strategy=table/store=idemtest/path="+c.name, func(b *testing.B) {
			store := idemtest.NewMemStore(nil)
			g, err := idem.New(store, &idem.Config{Logger: discard})
			if err != nil {
				b.Fatal(err)
			}
			if c.prepare != nil {
				c.prepare(b, store, g)
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
			if c.key != "" || c.distinct {
				req.Header[http.CanonicalHeaderKey(idem.HeaderKey)] = keyValue
			}
			var keyBuf []byte
			w := &writer{h: http.Header{}}
			b.ReportAllocs()
			i := int64(0)
			for b.Loop() {
				if c.distinct {
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
