package reconcile_test

// The example behind the reconciler snippet of docs/operating.md (checked by
// the root package's TestDocsSnippetsAreExamples).

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/clock"
	"github.com/idemguard/idem/reconcile"
)

// docsCharge is a charge at the fake payment provider.
type docsCharge struct{ ID string }

// docsProvider is a payment provider that knows the charges made under each
// idempotency key.
type docsProvider struct{ charges map[string]docsCharge }

// Lookup returns the charge made under key, if any.
func (p docsProvider) Lookup(ctx context.Context, key string) (docsCharge, bool, error) {
	c, ok := p.charges[key]
	return c, ok, ctx.Err()
}

// orderCreated is the answer the request would have given for a paid order.
func orderCreated(orderID string, c docsCharge) idem.Response {
	return idem.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Location": {"/orders/" + orderID}},
		Body:   []byte(`{"id":"` + orderID + `","charge":"` + c.ID + `"}`),
	}
}

// A payment that timed out (504) left its key in progress; the reconciler,
// running in the background as on every instance of a service, asks the
// provider about the order's payment key and settles the key with the real
// answer, which the next retry gets. It needs PostgreSQL at
// $TEST_DATABASE_URL (by default postgres://postgres@127.0.0.1:5432/postgres).
func ExampleNew() {
	ctx, stop := context.WithCancel(context.Background())
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	defer stop() // before pool.Close: Run returns its connection when ctx ends
	cfg := &durable.Config{Schema: "idem_docs_" + strings.ToLower(rand.Text()[:8])}
	defer pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+cfg.Schema+" CASCADE")
	if err := durable.Migrate(ctx, pool, cfg); err != nil {
		log.Fatal(err)
	}
	store, err := durable.New(pool, cfg)
	if err != nil {
		log.Fatal(err)
	}
	guard, err := idem.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	provider := docsProvider{charges: map[string]docsCharge{}}

	// The request: the provider charges, but its answer never comes.
	req := idem.Request{Scope: "user-42", Key: "key-1", Fingerprint: idem.HashRequest("POST", "/orders", []byte(`{"hold_ids":[88211]}`))}
	resp, out, _ := guard.Do(ctx, req, func(ctx context.Context) (idem.Response, error) {
		intent := idem.ExecutionFromContext(ctx).Intent
		paymentKey, err := idem.DownstreamKey("order", idem.DeriveID("ord_", "order", intent))
		if err != nil {
			return idem.Response{}, err
		}
		provider.charges[paymentKey] = docsCharge{ID: "ch_1"}
		return idem.Response{Status: http.StatusGatewayTimeout}, nil
	})
	fmt.Println("request:", resp.Status, out)
	// Only so that the example runs at once: pretend two minutes passed, on
	// the database's clock and on the reconciler's own (a test hook of this
	// module; a reconciler counts MinAge from when it first lists a key).
	if _, err := pool.Exec(ctx, "UPDATE "+store.Table()+" SET created_at = now() - interval '2 minutes', hold_until = now() - interval '1 minute'"); err != nil {
		log.Fatal(err)
	}
	ctx = clock.WithHeadStart(ctx, 2*time.Minute)

	rec, err := reconcile.New(guard, store, func(ctx context.Context, it reconcile.Item) (reconcile.Decision, error) {
		orderID := idem.DeriveID("ord_", "order", it.Intent) // as the request derived it
		paymentKey, err := idem.DownstreamKey("order", orderID)
		if err != nil {
			return reconcile.Decision{}, err
		}
		charge, found, err := provider.Lookup(ctx, paymentKey)
		switch {
		case err != nil:
			return reconcile.Decision{}, err // unknown: tried again later, with backoff
		case !found:
			return reconcile.Decision{Verdict: reconcile.NothingHappened}, nil // released: the next retry runs
		}
		return reconcile.Decision{Verdict: reconcile.Settled, Response: orderCreated(orderID, charge)}, nil // replayed to the next retry
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	go rec.Run(ctx) // on every instance: one at a time reconciles, every 30 s

	// The client's retries: 409 until the reconciler has settled the key.
	notAgain := func(context.Context) (idem.Response, error) { panic("the work ran twice") }
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, out, err = guard.Do(ctx, req, notAgain)
		if !errors.Is(err, idem.ErrInProgress) || time.Now().After(deadline) {
			break
		}
	}
	fmt.Println("retry:", resp.Status, out, resp.Header.Get("Location") != "")
	// Output:
	// request: 504 executed_unstored
	// retry: 201 replayed true
}
