// Command checkout is a small checkout service whose POST /orders is guarded
// by idem: a client that retries (a timeout, a double click, a mobile network
// that drops the answer) gets the first answer again instead of a second order
// and a second charge.
//
// Usage:
//
//	go run ./examples/checkout [flags]
//
//	-addr HOST:PORT          listen address (default 127.0.0.1:8080; port 0 picks one)
//	-strategy hybrid|table   hybrid: a Redis lease filters retries, then the
//	                         PostgreSQL claim decides who runs; table: the claim
//	                         alone (default hybrid)
//	-database-url URL        PostgreSQL (default $DATABASE_URL, else
//	                         postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable)
//	-schema NAME             schema of every table (default checkout)
//	-redis-addr HOST:PORT    Redis for the hybrid strategy, or "embedded" for an
//	                         in-process miniredis (default $REDIS_ADDR, else embedded)
//	-work DURATION           latency of the fake payment call (default 400ms)
//	-work-timeout D          the guard's WorkTimeout (default 20s)
//	-store-timeout D         the guard's StoreTimeout (default 5s)
//	-lease-ttl D             the Redis lease's TTL, whole seconds (default 30s)
//	-ttl DURATION            how long idempotency keys are kept (default 24h)
//	-reconcile-every D       how often the reconciler runs (default 10s)
//	-reconcile-after D       age of an in-progress key before it is reconciled (default 1m)
//	-sweep-every D           how often expired keys are deleted (default 1h)
//
// Routes:
//
//	POST /orders          Authorization: Bearer <user-id>, Idempotency-Key,
//	                      {"hold_ids": [88211, 88212], "payment_method": "pm_..."}
//	GET  /orders/{id}     the order, to its owner
//	GET  /payrail/charges {"count": N, "attempts": M}: charges the fake provider
//	                      has performed, and charge calls it has received (replays
//	                      and refusals included); its state is kept in PostgreSQL
//	                      (tables payrail_*), shared by instances on one database
//	GET  /readyz          200 once PostgreSQL has been reached and migrated, else 503
//
// payment_method pm_declined answers 402 (stored and replayed); pm_timeout
// charges but answers 504, which leaves the key in progress: retries get 409
// until the reconciler has asked the provider about the order's payment key
// (order-{public_id}) and settled the key with the real answer (201).
//
// It prints "listening on http://ADDR" to stdout once it accepts connections,
// logs to stderr, and shuts down gracefully on SIGINT or SIGTERM. Invalid
// flags exit with status 2, whether or not PostgreSQL is reachable. It starts
// while PostgreSQL is down: every request then gets 503 with Retry-After and
// /readyz answers 503, until PostgreSQL is back (tried every second); then it
// applies the migrations and serves.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/lock"
	"github.com/idemguard/idem/pgidem"
	"github.com/idemguard/idem/reconcile"
)

const (
	defaultAddr        = "127.0.0.1:8080"
	defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	defaultSchema      = "checkout"
	embeddedRedis      = "embedded"

	// problemBase prefixes the type URI of every problem the service sends.
	problemBase = "https://stagedoor.example/problems/"

	// shutdownTimeout bounds how long in-flight requests may finish at
	// shutdown.
	shutdownTimeout = 15 * time.Second
	// connectTimeout bounds each attempt to reach PostgreSQL and migrate, and
	// the start-up check of Redis.
	connectTimeout = 5 * time.Second
)

// errUsage marks an invalid command line; main exits with status 2.
var errUsage = errors.New("invalid command line")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// exitCode maps run's error to the process status: 0 on success or -h, 2 for
// an invalid command line (already explained on stderr), 1 otherwise.
func exitCode(err error, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	}
	fmt.Fprintf(stderr, "checkout: %v\n", err)
	return 1
}

// config is the parsed command line.
type config struct {
	addr        string
	strategy    string
	databaseURL string
	pool        *pgxpool.Config
	schema      string
	redisAddr   string
	work        time.Duration
	ttl         time.Duration

	workTimeout  time.Duration
	storeTimeout time.Duration
	leaseTTL     time.Duration

	reconcileEvery time.Duration
	reconcileAfter time.Duration
	sweepEvery     time.Duration
}

// parseFlags parses args. Errors wrap errUsage (or are flag.ErrHelp) and have
// been explained on stderr.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("checkout", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	var strategy string
	fs.StringVar(&c.addr, "addr", defaultAddr, "listen `HOST:PORT` (port 0 picks a free port)")
	fs.StringVar(&strategy, "strategy", "hybrid", "`hybrid` (Redis lease + PostgreSQL) or table (PostgreSQL only)")
	fs.StringVar(&c.databaseURL, "database-url", envOr("DATABASE_URL", defaultDatabaseURL), "PostgreSQL connection `URL` ($DATABASE_URL)")
	fs.StringVar(&c.schema, "schema", defaultSchema, "PostgreSQL `schema` of the idempotency_keys, checkout_orders and payrail_* tables, created if missing (\"\": the connection's current schema)")
	fs.StringVar(&c.redisAddr, "redis-addr", envOr("REDIS_ADDR", embeddedRedis), "Redis `HOST:PORT` for -strategy hybrid, or \"embedded\" for an in-process miniredis ($REDIS_ADDR)")
	fs.DurationVar(&c.work, "work", 400*time.Millisecond, "latency of the fake payment provider's charge call")
	fs.DurationVar(&c.workTimeout, "work-timeout", 20*time.Second, "the guard's WorkTimeout: how long a request's work may run")
	fs.DurationVar(&c.storeTimeout, "store-timeout", 5*time.Second, "the guard's StoreTimeout: how long each PostgreSQL call may take")
	fs.DurationVar(&c.leaseTTL, "lease-ttl", 30*time.Second, "TTL of the Redis lease of -strategy hybrid, in whole seconds")
	fs.DurationVar(&c.ttl, "ttl", durable.DefaultRetention, "how long an idempotency key's answer is kept after it is stored (longer than the guard's MaxHold, 46.5s with the defaults, and than -reconcile-after + -reconcile-every); a key without an answer never expires")
	fs.DurationVar(&c.reconcileEvery, "reconcile-every", 10*time.Second, "how often the reconciler looks for keys a 5xx left in progress")
	fs.DurationVar(&c.reconcileAfter, "reconcile-after", reconcile.DefaultMinAge, "how long a key must have been in progress before the reconciler asks the provider (longer than the guard's MaxHold, 46.5s with the defaults)")
	fs.DurationVar(&c.sweepEvery, "sweep-every", durable.DefaultSweepInterval, "how often expired keys are deleted")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, err
		}
		return c, fmt.Errorf("%w: %w", errUsage, err) // flag printed the message and usage
	}

	usage := func(format string, a ...any) (config, error) {
		msg := fmt.Sprintf(format, a...)
		fmt.Fprintf(stderr, "checkout: %s\nRun 'checkout -h' for usage.\n", msg)
		return c, fmt.Errorf("%w: %s", errUsage, msg)
	}
	if fs.NArg() > 0 {
		return usage("unexpected argument %q", fs.Arg(0))
	}
	c.strategy = strategy
	if c.strategy != "hybrid" && c.strategy != "table" {
		return usage("-strategy must be %q or %q, not %q", "hybrid", "table", strategy)
	}
	if _, _, err := net.SplitHostPort(c.addr); err != nil {
		return usage("-addr %q: want HOST:PORT", c.addr)
	}
	if c.databaseURL == "" {
		return usage("-database-url is empty")
	}
	pc, err := pgxpool.ParseConfig(c.databaseURL)
	if err != nil {
		return usage("-database-url: %v", err) // pgx redacts the password
	}
	c.pool = pc
	if c.redisAddr != embeddedRedis {
		if _, port, err := net.SplitHostPort(c.redisAddr); err != nil || port == "" {
			return usage("-redis-addr %q: want HOST:PORT or %q", c.redisAddr, embeddedRedis)
		}
	}
	if c.work < 0 {
		return usage("-work %v must not be negative", c.work)
	}
	if c.ttl < time.Second {
		return usage("-ttl %v must be at least 1s", c.ttl)
	}
	for name, d := range map[string]time.Duration{
		"-work-timeout": c.workTimeout, "-store-timeout": c.storeTimeout, "-lease-ttl": c.leaseTTL,
		"-reconcile-every": c.reconcileEvery, "-reconcile-after": c.reconcileAfter, "-sweep-every": c.sweepEvery,
	} {
		if d <= 0 {
			return usage("%s %v must be positive", name, d)
		}
	}
	// A key the reconciler settles lives -ttl from then; a client told to
	// come back by a 409 must find it (reconcile.New refuses it too).
	if c.ttl <= c.reconcileAfter+c.reconcileEvery {
		return usage("-ttl %v must be longer than -reconcile-after %v + -reconcile-every %v", c.ttl, c.reconcileAfter, c.reconcileEvery)
	}
	// The store's own rules (schema name) are checked without a database.
	if err := c.storeConfig().Validate(); err != nil {
		return usage("-schema %q: %v", c.schema, err)
	}
	return c, nil
}

func (c *config) storeConfig() *durable.Config {
	return &durable.Config{Schema: c.schema, Retention: c.ttl}
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

// run is the whole service: it parses args, builds the guard, serves until
// ctx ends, then shuts down gracefully. It writes "listening on http://ADDR"
// to stdout once the listener is bound and logs to stderr.
//
// Everything that can refuse the command line is checked before PostgreSQL
// is contacted, so a bad command line is status 2 whether or not the database
// is reachable. A database that cannot be reached at start is not fatal: the
// service listens at once, answers 503 with Retry-After and reports not ready
// on GET /readyz, and retries every second; once it connects (and has
// migrated), it serves.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))

	// PostgreSQL: the source of truth for every answer. The pool connects
	// when first used.
	pool, err := pgxpool.NewWithConfig(ctx, cfg.pool)
	if err != nil {
		return fmt.Errorf("postgres %s: %w", describeDB(cfg.pool), err)
	}
	defer pool.Close()

	// DetachWork: a client that hangs up must not cancel a charge under way
	// and turn it into an unknown outcome; the work keeps the guard's
	// deadline (WorkTimeout, 20s by default), and its answer is stored and
	// replayed to the client's retry.
	gcfg := &idem.Config{Logger: log, DetachWork: true, WorkTimeout: cfg.workTimeout, StoreTimeout: cfg.storeTimeout}
	// Redis, for the hybrid strategy only.
	redisDesc := "unused"
	var rdb redis.UniversalClient // nil: the table strategy
	var lcfg *lock.Config
	if cfg.strategy == "hybrid" {
		lcfg = &lock.Config{TTL: cfg.leaseTTL}
		addr := cfg.redisAddr
		if addr == embeddedRedis {
			mr, err := miniredis.Run()
			if err != nil {
				return fmt.Errorf("embedded redis: %w", err)
			}
			defer mr.Close()
			// Keys expire as time passes, as in a real Redis: without
			// this, miniredis moves TTLs only when told to (FastForward),
			// and a lease would never age nor expire.
			mr.ClockTTL(true)
			addr = mr.Addr()
			redisDesc = "embedded miniredis at " + addr
		} else {
			redisDesc = addr
		}
		client := redis.NewClient(&redis.Options{ // as docs/configuration.md explains
			Addr:                  addr,
			ContextTimeoutEnabled: true,
			MaxRetries:            -1,
			DialerRetries:         1,
			DialTimeout:           250 * time.Millisecond,
		})
		defer func() { _ = client.Close() }()
		rctx, cancel := context.WithTimeout(ctx, connectTimeout)
		if err := client.Ping(rctx).Err(); err != nil {
			// Not fatal: while Redis is away, the guard falls back to the
			// PostgreSQL claim for each request.
			log.Warn("checkout: redis unreachable; requests fall back to the table claim until it is back",
				"redis", addr, "error", err)
		}
		cancel()
		rdb = client
	}
	c := &checkout{render: renderProblem, log: log} // orders and payrail once the database is reached

	// The guard, and the maintenance that svc.Run runs on every instance:
	// the reconciler and the sweeper each take a lease row of the table
	// (<table>_leases), so one instance at a time does the work.
	svc, err := pgidem.New(pool, rdb, c.resolve, &pgidem.Config{
		Store:     cfg.storeConfig(),
		Guard:     gcfg,
		Lock:      lcfg,
		Reconcile: &reconcile.Config{Interval: cfg.reconcileEvery, MinAge: cfg.reconcileAfter},
		Sweep:     &durable.SweeperConfig{Interval: cfg.sweepEvery},
	})
	if err != nil {
		// A -ttl not longer than the guard's MaxHold (46.5s with the
		// defaults), or than the longest Retry-After of a pending key, or
		// a -lease-ttl that is not whole seconds, say.
		fmt.Fprintf(stderr, "checkout: %v\n", err)
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	guard := svc.Guard()

	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return err
	}
	front := &service{next: newHandler(svc, c), render: c.render}
	srv := &http.Server{
		Handler:           accessLog(log, front),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}

	maintCtx, stopMaintenance := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	defer func() {
		stopMaintenance()
		wg.Wait()
	}()
	// prepare reaches the database and creates what the service needs there;
	// it is repeated until it succeeds, and is safe when several instances
	// run it at once (each step takes an advisory lock).
	prepare := func(ctx context.Context) error {
		pctx, cancel := context.WithTimeout(ctx, connectTimeout)
		defer cancel()
		if err := pool.Ping(pctx); err != nil {
			return fmt.Errorf("postgres %s unreachable: %w", describeDB(cfg.pool), err)
		}
		if err := durable.Migrate(pctx, pool, cfg.storeConfig()); err != nil {
			return err
		}
		orders, err := newOrderStore(pctx, pool, cfg.schema)
		if err != nil {
			return err
		}
		payrail, err := NewPayrail(pctx, pool, cfg.schema, cfg.work)
		if err != nil {
			return err
		}
		// Open the pool's connections now: a claim waits only briefly for
		// a free connection (durable.Config.AdmissionWait), and dialling one
		// on a busy machine can take longer than that, which would turn
		// the first requests after the start into 503s.
		conns := make([]*pgxpool.Conn, 0, cfg.pool.MaxConns)
		for range cfg.pool.MaxConns {
			conn, err := pool.Acquire(pctx)
			if err != nil {
				break // the connections opened so far are enough to start
			}
			conns = append(conns, conn)
		}
		for _, conn := range conns {
			conn.Release()
		}
		c.orders, c.payrail = orders, payrail
		return nil
	}
	serve := func() {
		front.ready.Store(true) // publishes c.orders and c.payrail to the handlers
		wg.Go(func() {
			if err := svc.Run(maintCtx); err != nil {
				log.Error("checkout: maintenance stopped", "error", err)
			}
		})
	}
	// A first attempt before listening: with the database up, the service
	// serves as soon as it says it listens.
	if err := prepare(ctx); err != nil {
		log.Warn("checkout: database not ready; answering 503 and retrying every second", "error", err)
		wg.Go(func() {
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				select {
				case <-maintCtx.Done():
					return
				case <-tick.C:
				}
				if err := prepare(maintCtx); err != nil {
					log.Debug("checkout: database still not ready", "error", err)
					continue
				}
				serve()
				log.Info("checkout: database ready; serving")
				return
			}
		})
	} else {
		serve()
	}
	log.Info("checkout: started",
		"addr", ln.Addr().String(), "strategy", guard.Strategy(), "db", describeDB(cfg.pool),
		"schema", cfg.schema, "redis", redisDesc, "work", cfg.work, "ttl", cfg.ttl, "max_hold", guard.MaxHold(), "ready", front.ready.Load())

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(stdout, "listening on http://%s\n", ln.Addr())

	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("checkout: shutting down")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
		return fmt.Errorf("shutdown: %w", err)
	}
	<-served // http.ErrServerClosed
	// No request is served any more: stop the maintenance and send the
	// answers' copies still queued for Redis, before the deferred Closes.
	if err := svc.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	log.Info("checkout: stopped")
	return nil
}

// service answers GET /readyz, and every other request once the database
// has been reached: until then, 503 with Retry-After.
type service struct {
	ready  atomic.Bool
	next   http.Handler
	render func(w http.ResponseWriter, r *http.Request, p idem.Problem)
}

func (s *service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ready := s.ready.Load()
	if r.URL.Path == "/readyz" {
		w.Header().Set("Cache-Control", "no-store")
		if !ready {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "not ready: the database has not been reached yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
		return
	}
	if !ready {
		s.render(w, r, idem.Problem{
			Type:   problemBase + idem.ProblemServiceUnavailable,
			Title:  "Service temporarily unavailable",
			Status: http.StatusServiceUnavailable,
			Detail: "The service is starting: its database is not reachable yet. Retry later with the same Idempotency-Key.",
			Slug:   idem.ProblemServiceUnavailable,
			// 2 or 3 s, as the middleware's own 503: the instances that
			// start together are not retried in the same second.
			RetryAfter: idem.Classify(idem.OutcomeNone, idem.ErrUnavailable, idem.RetryHints{}).RetryAfter,
		})
		return
	}
	s.next.ServeHTTP(w, r)
}

// newHandler returns the service's routes. The guard's middleware comes from
// svc: its pending Retry-After is derived from the reconciler's settings.
func newHandler(svc *pgidem.Service, c *checkout) http.Handler {
	guarded := svc.Middleware(bearerUser, &idem.MiddlewareConfig{
		ProblemBase:   problemBase,
		RenderProblem: c.render,
	})
	mux := http.NewServeMux()
	mux.Handle("POST /orders", guarded(http.HandlerFunc(c.createOrder)))
	mux.HandleFunc("GET /orders/{id}", c.getOrder)
	mux.HandleFunc("GET /payrail/charges", func(w http.ResponseWriter, r *http.Request) {
		c.payrail.serveCount(w, r) // c.payrail is set once the database is reached
	})
	return mux
}

// renderProblem is idem's renderer plus the WWW-Authenticate challenge that a
// 401 must carry (RFC 9110, section 11.6.1).
func renderProblem(w http.ResponseWriter, r *http.Request, p idem.Problem) {
	if p.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="checkout"`)
	}
	p.Write(w)
}

// describeDB names the database for logs without its password, whatever form
// the connection string had (URL or key=value).
func describeDB(c *pgxpool.Config) string {
	cc := c.ConnConfig
	return fmt.Sprintf("postgres://%s@%s/%s", cc.User, net.JoinHostPort(cc.Host, fmt.Sprint(cc.Port)), cc.Database)
}

// accessLog logs one line per request.
func accessLog(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		log.LogAttrs(r.Context(), slog.LevelInfo, "request",
			slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Int("status", sw.status), slog.Bool("replayed", strings.EqualFold(w.Header().Get(idem.HeaderReplayed), "true")),
			slog.Duration("took", time.Since(start)))
	})
}

// statusWriter remembers the status of an answer.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
