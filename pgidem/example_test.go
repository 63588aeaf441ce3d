package pgidem_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/lock"
	"github.com/idemguard/idem/pgidem"
	"github.com/idemguard/idem/reconcile"
)

func databaseURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

// Production wiring in one place: the Guard over PostgreSQL and Redis (here
// an in-process miniredis), and one Run for the reconciler and the sweeper.
// It needs PostgreSQL at $TEST_DATABASE_URL (by default
// postgres://postgres@127.0.0.1:5432/postgres).
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rdb.Close()
	// A schema of the example's own, so that it leaves nothing behind.
	schema := "idem_example_" + strings.ToLower(rand.Text()[:8])
	defer pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")

	store := &durable.Config{Schema: schema}
	if err := durable.Migrate(ctx, pool, store); err != nil { // at start-up, on every instance
		log.Fatal(err)
	}
	// What really happened to a key a 5xx left in progress: ask the provider.
	resolve := func(ctx context.Context, it reconcile.Item) (reconcile.Decision, error) {
		return reconcile.Decision{Verdict: reconcile.Unknown}, nil // asked again later
	}
	locker, err := lock.New(rdb, nil) // the hybrid strategy
	if err != nil {
		log.Fatal(err)
	}
	svc, err := pgidem.New(pool, resolve, &pgidem.Config{Store: store, Guard: &idem.Config{Lock: locker, Logger: quiet()}})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- svc.Run(runCtx) }() // on every instance: one at a time reconciles and sweeps

	scope := func(r *http.Request) (string, bool) {
		return strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	}
	h := svc.Guard().Middleware(scope, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/orders/1")
		w.WriteHeader(http.StatusCreated)
	}))
	for range 2 { // the request, then its retry
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"sku":"A1"}`))
		req.Header.Set("Authorization", "Bearer user-42")
		req.Header.Set(idem.HeaderKey, "8e03978e-40d5-43e8-bc93-6894a57f9324")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		fmt.Printf("%d location=%s replayed=%q\n", w.Code, w.Header().Get("Location"), w.Header().Get(idem.HeaderReplayed))
	}
	fmt.Println("strategy:", svc.Guard().Strategy())

	stop()
	fmt.Println("stopped:", <-ran)
	// Output:
	// 201 location=/orders/1 replayed=""
	// 201 location=/orders/1 replayed="true"
	// strategy: hybrid
	// stopped: <nil>
}
