// Package fleet runs what the HTTP comparison measures in worker processes,
// each with its own pgx pool and Redis client, against one bench schema and
// Redis prefix, and drives them over HTTP. A worker is the bench binary
// itself, re-executed with an environment variable set (see [IsWorker] and
// [Serve]); [Start] starts them. [Meter] reads the CPU of the workers, of
// the PostgreSQL processes that serve them, of Redis and of the machine.
//
// A worker serves POST /orders through the guard's HTTP middleware (or the
// minimal SQL, target.MinimalHandler) in front of [target.Handler], and
// POST /stats, which makes its idle PostgreSQL connections publish their
// pending statistics.
//
// Workers never outlive the bench: they exit when their stdin (a pipe from
// the bench) reaches end of file, which happens when the bench closes it or
// dies, and the bench kills any that has not exited shortly after.
package fleet

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/pprof"
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

// Serve is the main function of a worker process: it parses args (the flags
// [Start] passes), serves on the address it prints to stdout as
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
		work      = fs.Duration("work", 0, "simulated handler latency")
		impl      = fs.String("impl", "guard", "what serves the requests: guard (the middleware) or minimal (target.MinimalHandler)")
		asyncAns  = fs.Bool("async-answers", false, "the guard's store returns answer writes before their flush (durable.Config.AsynchronousAnswers)")
		unshared  = fs.Bool("unshared", false, "the guard's store never shares statements among requests (it is not told the pool's state)")
		profile   = fs.String("cpuprofile", "", "write the worker's CPU profile, from start to exit, to this file")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *schema == "" || *prefix == "" || *poolSize < 1 || (*impl != "guard" && *impl != "minimal") {
		fmt.Fprintln(stderr, "bench worker: -schema, -prefix, a positive -pool-size and -impl guard or minimal are required")
		return 2
	}
	if *profile != "" {
		stop, err := startProfile(*profile)
		if err != nil {
			fmt.Fprintf(stderr, "bench worker: %v\n", err)
			return 1
		}
		defer stop()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		// The bench holds the other end: EOF means it closed it or died.
		_, _ = io.Copy(io.Discard, stdin)
		cancel()
	}()
	pc, err := pgxpool.ParseConfig(os.Getenv(databaseEnv))
	if err != nil {
		fmt.Fprintf(stderr, "bench worker: database URL: %v\n", err)
		return 1
	}
	pc.MaxConns = int32(*poolSize)
	// The meter finds the backends of the fleet by this name.
	pc.ConnConfig.RuntimeParams["application_name"] = *schema
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		fmt.Fprintf(stderr, "bench worker: postgres: %v\n", err)
		return 1
	}
	defer pool.Close()
	// The same client settings as the in-process guard's (target.Open).
	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr, PoolSize: *redisPool, ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rdb.Close()

	var orders http.Handler
	db := fixture.NewCountingDB(pool) // passes the pool's Stat on: the store shares statements
	if *impl == "minimal" {
		env := &target.Env{Pool: pool, Redis: rdb, Schema: *schema, Prefix: *prefix, PGStatements: db}
		orders, err = target.MinimalHandler(env, *strategy, func(r *http.Request) string { return r.Header.Get(ScopeHeader) }, target.Handler(*work))
	} else {
		var store durable.DB = db
		if *unshared {
			store = unsharedDB{db}
		}
		var g *idem.Guard
		if g, err = target.NewGuard(store, rdb, *schema, *prefix, *strategy, *asyncAns); err == nil {
			orders = g.Middleware(func(r *http.Request) (string, bool) {
				s := r.Header.Get(ScopeHeader)
				return s, s != ""
			}, nil)(target.Handler(*work))
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "bench worker: %v\n", err)
		return 1
	}
	if err := serve(ctx, *addr, pool, orders, stdout); err != nil {
		fmt.Fprintf(stderr, "bench worker: %v\n", err)
		return 1
	}
	return 0
}

func serve(ctx context.Context, addr string, pool *pgxpool.Pool, orders http.Handler, stdout io.Writer) error {
	mux := http.NewServeMux()
	mux.Handle("POST /orders", orders)
	mux.HandleFunc("POST /stats", func(w http.ResponseWriter, r *http.Request) {
		// PostgreSQL 15+; older servers lack the function.
		for _, conn := range pool.AcquireAllIdle(r.Context()) {
			_, _ = conn.Exec(r.Context(), "SELECT pg_stat_force_next_flush()")
			conn.Release()
		}
		w.WriteHeader(http.StatusNoContent)
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

// startProfile starts the CPU profile written to path when stop is called.
func startProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

// unsharedDB hides the pool's Stat from the store, which then runs every
// request's statement alone.
type unsharedDB struct{ durable.DB }
