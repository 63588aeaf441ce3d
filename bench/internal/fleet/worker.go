// Package fleet runs the guard in separate worker processes, each with its
// own pgx pool and Redis client, against one bench schema and Redis prefix,
// and drives them over HTTP: the many-instance deployment a capacity
// planner scales out to. A worker is the bench binary itself, re-executed
// with an environment variable set (see [IsWorker] and [Serve]); [Start]
// starts N of them and [Fleet.Op] spreads open-loop arrivals over them.
//
// A worker serves POST /orders through the guard's HTTP middleware in front
// of the in-process target's work ([target.Handler]), and POST /stats, which
// returns what it counted since the previous call (requests, executions of
// the handler by key, statements and Redis commands) and resets it.
//
// Workers never outlive the bench: they exit when their stdin (a pipe from
// the bench) reaches end of file, which happens when the bench closes it or
// dies, and the bench kills any that has not exited shortly after.
package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/bench/internal/fixture"
	"github.com/idemguard/idem/bench/internal/target"
	"github.com/idemguard/idem/durable"
)

// Environment variables of a worker process. The database URL travels in
// the environment, not on the command line, so that a password in it does
// not show in ps.
const (
	workerEnv   = "IDEM_BENCH_WORKER"
	databaseEnv = "IDEM_BENCH_DATABASE_URL"
)

// ScopeHeader carries the caller's identity (the guard's scope) to a worker:
// the bench has no authentication in front of the middleware.
const ScopeHeader = "X-Bench-User"

// IsWorker reports whether this process was started by [Start] as a worker;
// its main function must then call [Serve] and nothing else.
func IsWorker() bool { return os.Getenv(workerEnv) == "1" }

// Stats is what a worker counted between two calls of POST /stats. The call
// also makes the worker's idle PostgreSQL connections publish their pending
// statistics.
type Stats struct {
	PID int `json:"pid"`
	// Requests is the number of POST /orders the worker answered.
	Requests int64 `json:"requests"`
	// Executed counts the handler's executions by idempotency key.
	Executed map[string]int `json:"executed"`
	// PGStatements and RedisCommands are what the worker's guard sent.
	PGStatements  int64 `json:"pg_statements"`
	RedisCommands int64 `json:"redis_commands"`
}

// counters is a worker's live Stats.
type counters struct {
	requests atomic.Int64
	mu       sync.Mutex
	executed map[string]int
}

func (c *counters) execute(key string) {
	c.mu.Lock()
	c.executed[key]++
	c.mu.Unlock()
}

// take returns the executions counted so far and starts a new count.
func (c *counters) take() (int64, map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ex := c.executed
	c.executed = make(map[string]int)
	return c.requests.Swap(0), ex
}

// Serve is the main function of a worker process: it parses args (the flags
// [Start] passes), serves the guard on the address it prints to stdout as
// "listening <host:port>", and returns when stdin reaches end of file or ctx
// ends. It returns the process's exit code. Ctrl-C in the terminal does not
// stop a worker: the bench decides when its workers stop.
func Serve(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	signal.Ignore(os.Interrupt)
	fs := flag.NewFlagSet("bench worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		addr      = fs.String("addr", "127.0.0.1:0", "listen address")
		strategy  = fs.String("strategy", target.Table, "table or hybrid")
		schema    = fs.String("schema", "", "bench schema (created by the bench)")
		prefix    = fs.String("prefix", "", "Redis key prefix (ends with ':')")
		redisAddr = fs.String("redis-addr", "127.0.0.1:6379", "Redis address")
		poolSize  = fs.Int("pool-size", 4, "pgx pool size (MaxConns)")
		redisPool = fs.Int("redis-pool-size", 0, "go-redis pool size (0: its default)")
		work      = fs.Duration("work", 5*time.Millisecond, "simulated handler latency")
		impl      = fs.String("impl", target.Guard, "what serves the requests: guard (the middleware) or minimal (target.MinimalHandler)")
		asyncAns  = fs.Bool("async-answers", false, "the guard's store returns answer writes before their flush (durable.Config.AsynchronousAnswers)")
		unshared  = fs.Bool("unshared", false, "the guard's store never shares statements among requests (it is not told the pool's state)")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *schema == "" || *prefix == "" || *poolSize < 1 {
		fmt.Fprintln(stderr, "bench worker: -schema, -prefix and a positive -pool-size are required")
		return 2
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		// The bench holds the other end: EOF means it closed it or died.
		_, _ = io.Copy(io.Discard, stdin)
		cancel()
	}()
	if *impl != target.Guard && *impl != target.Minimal {
		fmt.Fprintf(stderr, "bench worker: -impl %q: want guard or minimal\n", *impl)
		return 2
	}
	if err := serve(ctx, *addr, *impl, *asyncAns, *unshared, *strategy, *schema, *prefix, *redisAddr, *poolSize, *redisPool, *work, stdout); err != nil {
		fmt.Fprintf(stderr, "bench worker: %v\n", err)
		return 1
	}
	return 0
}

func serve(ctx context.Context, addr, impl string, asyncAnswers, unshared bool, strategy, schema, prefix, redisAddr string, poolSize, redisPool int, work time.Duration, stdout io.Writer) error {
	pc, err := pgxpool.ParseConfig(os.Getenv(databaseEnv))
	if err != nil {
		return fmt.Errorf("database URL: %w", err)
	}
	pc.MaxConns = int32(poolSize)
	// The meter finds the backends of the fleet by this name.
	pc.ConnConfig.RuntimeParams["application_name"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer pool.Close()
	// The same client settings as the in-process targets' (target.Open).
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: redisPool, ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rdb.Close()
	redisCmds := &fixture.RedisCounter{}
	rdb.AddHook(redisCmds)
	db := fixture.NewCountingDB(pool)

	c := &counters{executed: make(map[string]int)}
	handler := target.Handler(work)
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.execute(r.Header.Get(idem.HeaderKey))
		handler.ServeHTTP(w, r)
	})
	var guarded http.Handler
	if impl == target.Minimal {
		env := &target.Env{Pool: pool, Redis: rdb, Schema: schema, Prefix: prefix, PGStatements: db, RedisCmds: redisCmds}
		guarded, err = target.MinimalHandler(env, strategy, func(r *http.Request) string { return r.Header.Get(ScopeHeader) }, counted)
		if err != nil {
			return err
		}
	} else {
		var store durable.DB = db
		if unshared {
			store = unsharedDB{db}
		}
		g, err := target.NewGuard(store, rdb, schema, prefix, strategy, asyncAnswers)
		if err != nil {
			return err
		}
		guarded = g.Middleware(func(r *http.Request) (string, bool) {
			s := r.Header.Get(ScopeHeader)
			return s, s != ""
		}, nil)(counted)
	}
	var (
		statsMu       sync.Mutex
		stmts0, cmds0 int64
	)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		c.requests.Add(1)
		guarded.ServeHTTP(w, r)
	})
	mux.HandleFunc("POST /stats", func(w http.ResponseWriter, r *http.Request) {
		statsMu.Lock()
		defer statsMu.Unlock()
		// Make every idle connection publish its pending statistics (WAL
		// flushes among them) now rather than up to 10 s later, so that the
		// caller's server-wide counters read after this include the
		// worker's work (PostgreSQL 15+; older servers lack the function).
		for _, conn := range pool.AcquireAllIdle(r.Context()) {
			_, _ = conn.Exec(r.Context(), "SELECT pg_stat_force_next_flush()")
			conn.Release()
		}
		stmts, cmds := db.Count(), redisCmds.Count()
		s := Stats{PID: os.Getpid(), PGStatements: stmts - stmts0, RedisCommands: cmds - cmds0}
		stmts0, cmds0 = stmts, cmds
		s.Requests, s.Executed = c.take()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s)
	})

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	fmt.Fprintf(stdout, "listening %s\n", ln.Addr())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// unsharedDB hides the pool's Stat from the store, which then runs every
// request's statement alone.
type unsharedDB struct{ durable.DB }
