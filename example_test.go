package idem_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/lock"
)

func databaseURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

// The middleware on a checkout endpoint, with the hybrid strategy: an
// in-process miniredis holds the leases, PostgreSQL stores the answers. A
// retry is replayed, a reused key with another body is refused.
func ExampleGuard_Middleware() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// A schema of its own, so the example leaves nothing behind.
	schema := "idem_example_" + strings.ToLower(rand.Text()[:8])
	defer pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	cfg := &durable.Config{Schema: schema}
	if err := durable.Migrate(ctx, pool, cfg); err != nil {
		log.Fatal(err)
	}
	store, err := durable.New(pool, cfg)
	if err != nil {
		log.Fatal(err)
	}

	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rdb.Close()
	locker, err := lock.New(rdb, nil)
	if err != nil {
		log.Fatal(err)
	}

	guard, err := idem.New(store, &idem.Config{
		Lock:   locker,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		log.Fatal(err)
	}

	charges := 0
	orders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++ // the side effect that must happen once
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", charges))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintln(w, `{"status":"paid"}`)
	})
	// Demo authentication: the bearer token is the user id.
	scope := func(r *http.Request) (string, bool) {
		return strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	}
	srv := httptest.NewServer(guard.Middleware(scope, nil)(orders))
	defer srv.Close()

	post := func(key, body string) {
		req, _ := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer user-42")
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Printf("%d location=%q replayed=%q\n", resp.StatusCode, resp.Header.Get("Location"), resp.Header.Get("Idempotent-Replayed"))
	}
	post("8e03978e-40d5-43e8-bc93-6894a57f9324", `{"hold_ids":[88211]}`)
	post("8e03978e-40d5-43e8-bc93-6894a57f9324", `{"hold_ids":[88211]}`) // the browser's retry
	post("8e03978e-40d5-43e8-bc93-6894a57f9324", `{"hold_ids":[99999]}`) // a client bug
	fmt.Println("charges:", charges)
	// Output:
	// 201 location="/orders/1" replayed=""
	// 201 location="/orders/1" replayed="true"
	// 422 location="" replayed=""
	// charges: 1
}

// The transport-agnostic core, as a queue consumer or gRPC interceptor would
// use it: the work runs once per (scope, key); a 5xx leaves the key in
// progress until it is settled.
func ExampleGuard_Do() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	schema := "idem_example_" + strings.ToLower(rand.Text()[:8])
	defer pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	cfg := &durable.Config{Schema: schema}
	if err := durable.Migrate(ctx, pool, cfg); err != nil {
		log.Fatal(err)
	}
	store, err := durable.New(pool, cfg)
	if err != nil {
		log.Fatal(err)
	}
	guard, err := idem.New(store, &idem.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}) // table strategy
	if err != nil {
		log.Fatal(err)
	}

	msg := []byte(`{"invoice":"inv_1","amount":4200}`)
	req := idem.Request{Scope: "tenant-7", Key: "msg-1", Fingerprint: idem.HashParts([]byte("invoice.pay"), msg)}
	pay := func(status int) idem.Work {
		return func(ctx context.Context) (idem.Response, error) {
			return idem.Response{Status: status, Body: []byte("paid")}, nil
		}
	}

	_, out, _ := guard.Do(ctx, req, pay(http.StatusGatewayTimeout)) // provider timed out
	fmt.Println(out)
	_, out, err = guard.Do(ctx, req, pay(http.StatusOK)) // redelivery: unknown yet
	fmt.Println(out, err)
	// Reconciliation learned that the payment went through. Settle acts only
	// on the attempt it names by its owner token (a reconciler passes the
	// one it listed).
	row, err := store.Get(ctx, req.Scope, req.Key)
	if err != nil {
		log.Fatal(err)
	}
	if err := guard.Settle(ctx, req.Scope, req.Key, row.Owner, idem.Response{Status: http.StatusOK, Body: []byte("paid")}); err != nil {
		log.Fatal(err)
	}
	resp, out, _ := guard.Do(ctx, req, pay(http.StatusOK))
	fmt.Println(out, resp.Status, string(resp.Body))
	// Output:
	// executed_unstored
	// in_progress idem: request in progress
	// replayed 200 paid
}

// A queue consumer acts on the Decision, with no HTTP status in sight:
// acknowledge what was answered, dead-letter what no redelivery can change,
// and redeliver the rest, after RetryAfter when the guard refused it.
func ExampleClassify() {
	hints := idem.RetryHints{Pending: 5 * time.Minute} // the reconciler's pace
	handle := func(outcome idem.Outcome, err error) string {
		d := idem.Classify(outcome, err, hints)
		switch {
		case outcome == idem.OutcomeExecuted || outcome == idem.OutcomeReplayed:
			return "ack"
		case d.Slug == "":
			return "redeliver now" // the work ran: its answer is not stored, or it released the key
		case d.RetryAfter > 0:
			// broker.Nack(msg, d.RetryAfter): 1-2s in progress, 5-6m pending, 2-3s unavailable
			return "redeliver after RetryAfter, " + d.Slug
		}
		return "dead letter, " + d.Slug // the sender's bug: no redelivery changes it
	}
	for _, r := range []struct {
		outcome idem.Outcome
		err     error
	}{
		{idem.OutcomeExecuted, nil},
		{idem.OutcomeReplayed, nil},
		{idem.OutcomeExecutedUnstored, errors.New("provider timeout")},
		{idem.OutcomeExecutedReleased, idem.ErrRetrySafe},
		{idem.OutcomeInProgress, idem.ErrInProgress},
		{idem.OutcomeInProgress, idem.ErrPending},
		{idem.OutcomeNone, fmt.Errorf("idem: claim: %w: connection refused", idem.ErrUnavailable)},
		{idem.OutcomeKeyReused, idem.ErrKeyReused},
		{idem.OutcomeNone, &idem.RequestError{Field: "Scope", Reason: "empty"}},
	} {
		fmt.Printf("%-17s %s\n", r.outcome, handle(r.outcome, r.err))
	}
	// Output:
	// executed          ack
	// replayed          ack
	// executed_unstored redeliver now
	// executed_released redeliver now
	// in_progress       redeliver after RetryAfter, request-in-progress
	// in_progress       redeliver after RetryAfter, request-pending
	// none              redeliver after RetryAfter, service-unavailable
	// key_reused        dead letter, idempotency-key-reused
	// none              dead letter, unauthenticated
}
