package pgidem_test

// The examples behind the Go snippets of README.md and docs/*.md that show
// pgidem (see docs_test.go): change the example, run it, then copy the lines
// to the page.

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/lock"
	"github.com/idemguard/idem/pgidem"
	"github.com/idemguard/idem/reconcile"
)

// docsEnv sets DATABASE_URL to a database URL whose connections use a fresh
// schema (search_path), and REDIS_ADDR to an in-process miniredis, as a
// service's environment would set them; the returned function drops the
// schema and restores the environment.
func docsEnv(ctx context.Context) (restore func()) {
	conn, err := pgx.Connect(ctx, databaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	schema := "idem_docs_" + strings.ToLower(rand.Text()[:8])
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		log.Fatal(err)
	}
	u, err := url.Parse(databaseURL())
	if err != nil {
		log.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	oldDB, oldRedis := os.Getenv("DATABASE_URL"), os.Getenv("REDIS_ADDR")
	os.Setenv("DATABASE_URL", u.String())
	os.Setenv("REDIS_ADDR", mr.Addr())
	return func() {
		os.Setenv("DATABASE_URL", oldDB)
		os.Setenv("REDIS_ADDR", oldRedis)
		mr.Close()
		ctx := context.WithoutCancel(ctx)
		conn, err := pgx.Connect(ctx, databaseURL())
		if err != nil {
			log.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			log.Fatal(err)
		}
	}
}

type userKey struct{}

func userID(ctx context.Context) (string, bool) {
	u, ok := ctx.Value(userKey{}).(string)
	return u, ok
}

// authenticate is demo authentication: the bearer token is the user id.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && u != "" {
			r = r.WithContext(context.WithValue(r.Context(), userKey{}, u))
		}
		next.ServeHTTP(w, r)
	})
}

// The README's production wiring: the Guard over PostgreSQL and Redis, the
// reconciler and the sweeper in one Run, the middleware on POST /orders.
func ExampleNew_production() {
	defer docsEnv(context.Background())()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	defer slog.SetDefault(slog.Default()) // the example's lines are noise: restore the logger after
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	createOrder := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/orders/ord_1")
		w.WriteHeader(http.StatusCreated)
	}
	// What really happened to a key a 5xx left in progress: ask the payment
	// provider (docs/operating.md, Reconciliation).
	resolve := func(ctx context.Context, it reconcile.Item) (reconcile.Decision, error) {
		return reconcile.Decision{Verdict: reconcile.Unknown}, nil // asked again later
	}

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := durable.Migrate(ctx, pool, nil); err != nil { // creates idempotency_keys; safe on every instance
		log.Fatal(err)
	}
	// Redis for the hybrid strategy; leave Guard.Lock nil for PostgreSQL alone.
	rdb := redis.NewClient(&redis.Options{ // as docs/configuration.md explains
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		DialerRetries:         1,
		DialTimeout:           250 * time.Millisecond,
	})
	defer rdb.Close()
	locker, err := lock.New(rdb, nil)
	if err != nil {
		log.Fatal(err)
	}
	svc, err := pgidem.New(pool, resolve, &pgidem.Config{Guard: &idem.Config{Lock: locker}})
	if err != nil {
		log.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- svc.Run(ctx) }() // the reconciler and the sweeper, until ctx ends

	scope := func(r *http.Request) (string, bool) { return userID(r.Context()) }
	mux := http.NewServeMux()
	mux.Handle("POST /orders", svc.Guard().Middleware(scope, nil)(http.HandlerFunc(createOrder)))

	srv := httptest.NewServer(authenticate(mux))
	for range 2 { // the click, then the browser's retry
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"hold_ids":[88211]}`))
		req.Header.Set("Authorization", "Bearer user-42")
		req.Header.Set(idem.HeaderKey, "8e03978e-40d5-43e8-bc93-6894a57f9324")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Printf("%d %s replayed=%q\n", resp.StatusCode, resp.Header.Get("Location"), resp.Header.Get(idem.HeaderReplayed))
	}
	srv.Close()

	// Once the server has stopped: stop Run and send the answers' copies
	// still queued for Redis, before the deferred rdb.Close and pool.Close.
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := svc.Shutdown(sctx); err != nil {
		log.Fatal(err)
	}
	if err := <-ran; err != nil { // Run has returned
		log.Fatal(err)
	}
	fmt.Println("strategy:", svc.Guard().Strategy())
	// Output:
	// 201 /orders/ord_1 replayed=""
	// 201 /orders/ord_1 replayed="true"
	// strategy: hybrid
}

// The docs' waiting retries: the Guard's Wait, with every instance announcing
// answers (Store.Notify); Run keeps the Listener behind the Guard.
func ExampleConfig_wait() {
	defer docsEnv(context.Background())()
	ctx, shutdown := context.WithCancel(context.Background())
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := durable.Migrate(ctx, pool, nil); err != nil {
		log.Fatal(err)
	}
	resolve := func(ctx context.Context, it reconcile.Item) (reconcile.Decision, error) {
		return reconcile.Decision{}, nil
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	svc, err := pgidem.New(pool, resolve, &pgidem.Config{
		Store: &durable.Config{Notify: true},                      // on every instance: answers are announced
		Guard: &idem.Config{Logger: quiet, Wait: 5 * time.Second}, // a retry waits up to 5s for a running request's answer
	})
	if err != nil {
		log.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- svc.Run(ctx) }() // the Listener too

	_, err = pgidem.New(pool, resolve, &pgidem.Config{Guard: &idem.Config{Wait: 5 * time.Second}})
	fmt.Println(err)

	shutdown()
	fmt.Println("stopped:", <-ran)
	// Output:
	// pgidem: Config.Guard.Wait 5s needs Config.Store.Notify: without announcements every waiting retry waits its whole bound, then gets 409
	// stopped: <nil>
}
