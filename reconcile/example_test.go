package reconcile_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/clock"
	"github.com/idemguard/idem/reconcile"
)

// A payment timed out (504): the key stays in progress and retries get 409.
// The reconciler asks the payment provider what happened and stores the real
// answer, which the next retry gets. It needs PostgreSQL at
// $TEST_DATABASE_URL (by default postgres://postgres@127.0.0.1:5432/postgres).
func ExampleReconciler_RunOnce() {
	ctx := context.Background()
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// A schema of the example's own; a service would use a fixed one.
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	cfg := &durable.Config{Schema: fmt.Sprintf("idem_example_%x", suffix)}
	defer pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+cfg.Schema+" CASCADE")
	if err := durable.Migrate(ctx, pool, cfg); err != nil {
		log.Fatal(err)
	}
	store, err := durable.New(pool, cfg)
	if err != nil {
		log.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	guard, err := idem.New(store, &idem.Config{WorkTimeout: 20 * time.Second, Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}

	// The payment provider, which charged although the answer never came.
	charged := map[string]bool{"order-A1": true}

	req := idem.Request{Scope: "user-42", Key: "7d1c0f9e", Fingerprint: idem.HashRequest("POST", "/orders", []byte(`{"sku":"A1"}`))}
	resp, out, _ := guard.Do(ctx, req, func(ctx context.Context) (idem.Response, error) {
		return idem.Response{Status: http.StatusGatewayTimeout}, nil // the charge timed out
	})
	fmt.Println("first try:", resp.Status, out)
	notAgain := func(ctx context.Context) (idem.Response, error) { panic("not run again") }
	_, _, err = guard.Do(ctx, req, notAgain)
	fmt.Println("retry:", err)

	rec, err := reconcile.New(guard, store, func(ctx context.Context, it reconcile.Item) (reconcile.Decision, error) {
		if !charged["order-A1"] { // a real resolver derives the provider's key from it
			return reconcile.Decision{Verdict: reconcile.NothingHappened}, nil
		}
		return reconcile.Decision{Verdict: reconcile.Settled, Response: idem.Response{
			Status: http.StatusCreated,
			Header: http.Header{"Location": {"/orders/A1"}},
			Body:   []byte(`{"order":"A1"}`),
		}}, nil
	}, &reconcile.Config{
		MinAge: time.Minute, // longer than the Guard's MaxHold (20s + 5s); logs to the Guard's quiet Logger
	})
	if err != nil {
		log.Fatal(err)
	}
	// Only so that the example runs at once: pretend two minutes passed, on
	// the database's clock and on the reconciler's own (a test hook of this
	// module; a reconciler counts MinAge from when it first lists a key).
	if _, err := pool.Exec(ctx, "UPDATE "+store.Table()+" SET created_at = now() - interval '2 minutes', hold_until = now() - interval '1 minute'"); err != nil {
		log.Fatal(err)
	}
	ctx = clock.WithHeadStart(ctx, 2*time.Minute)
	res, err := rec.RunOnce(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("reconciled: %+v\n", res)

	resp, out, err = guard.Do(ctx, req, notAgain)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("retry:", resp.Status, out, string(resp.Body))

	// Output:
	// first try: 504 executed_unstored
	// retry: idem: request in progress
	// reconciled: {Settled:1 Released:0 Unknown:0 Skipped:0 Errors:0}
	// retry: 201 replayed {"order":"A1"}
}
