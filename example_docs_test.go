package idem_test

// The examples behind the Go snippets of README.md and docs/*.md. Each
// snippet is a contiguous run of lines of one function here (see
// docs_test.go): change the example, run it, then copy the lines to the page.

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
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/idemtest"
	"github.com/idemguard/idem/lock"
)

// docsDatabase creates a schema of the example's own and returns a database
// URL whose connections use it (search_path), so that code written for the
// connection's default schema leaves nothing behind, and a function that
// drops the schema.
func docsDatabase(ctx context.Context) (dbURL string, drop func()) {
	conn, err := pgx.Connect(ctx, databaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	schema := "idem_docs_" + strings.ToLower(rand.Text()[:8])
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		log.Fatal(err)
	}
	drop = func() {
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
	u, err := url.Parse(databaseURL())
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return databaseURL() + " search_path=" + schema, drop // key=value form
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), drop
}

// setenv sets an environment variable for the rest of an example and returns
// the function that restores it.
func setenv(name, value string) (restore func()) {
	old, had := os.LookupEnv(name)
	if err := os.Setenv(name, value); err != nil {
		log.Fatal(err)
	}
	return func() {
		if had {
			_ = os.Setenv(name, old)
		} else {
			_ = os.Unsetenv(name)
		}
	}
}

// userKey carries the authenticated user in a request's context.
type userKey struct{}

// userID returns the user that authenticate found.
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

// docsPost sends a POST to target as user-42 and returns the answer, its
// body read.
func docsPost(target, key, body string) *http.Response {
	req, err := http.NewRequest(http.MethodPost, target, strings.NewReader(body))
	if err != nil {
		log.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer user-42")
	req.Header.Set(idem.HeaderKey, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// quiet is a logger for examples whose log lines would only be noise.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// The README's quick start: PostgreSQL alone (the table strategy), the
// middleware on POST /orders. The retry is replayed; the handler ran once.
func ExampleGuard_Middleware_quickStart() {
	ctx := context.Background()
	dbURL, drop := docsDatabase(ctx)
	defer drop()
	defer setenv("DATABASE_URL", dbURL)() // as a service's environment would set it

	charges := 0
	createOrder := func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.Header().Set("Location", "/orders/ord_1")
		w.WriteHeader(http.StatusCreated)
	}

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := durable.Migrate(ctx, pool, nil); err != nil { // creates idempotency_keys; safe on every instance
		log.Fatal(err)
	}
	store, err := durable.New(pool, nil) // keys live 24 h
	if err != nil {
		log.Fatal(err)
	}
	guard, err := idem.New(store, nil) // the table strategy: PostgreSQL alone
	if err != nil {
		log.Fatal(err)
	}

	// The scope is the authenticated caller; requests without one are refused.
	scope := func(r *http.Request) (string, bool) { return userID(r.Context()) }
	mux := http.NewServeMux()
	mux.Handle("POST /orders", guard.Middleware(scope, nil)(http.HandlerFunc(createOrder)))

	srv := httptest.NewServer(authenticate(mux))
	defer srv.Close()
	for range 2 { // the click, then the browser's retry
		resp := docsPost(srv.URL+"/orders", "8e03978e-40d5-43e8-bc93-6894a57f9324", `{"hold_ids":[88211]}`)
		fmt.Printf("%d %s replayed=%q\n", resp.StatusCode, resp.Header.Get("Location"), resp.Header.Get(idem.HeaderReplayed))
	}
	fmt.Println("charges:", charges)
	// Output:
	// 201 /orders/ord_1 replayed=""
	// 201 /orders/ord_1 replayed="true"
	// charges: 1
}

// docsMessage is a queue message: a tenant's payment order.
type docsMessage struct {
	Tenant, ID, Topic string
	Body              []byte
	status            int // what the fake payment answers
}

// consume is a queue consumer in front of a payment: Do's outcome and
// idem.Classify's Decision say what happened, and what to do with the
// message; no HTTP status is involved.
func consume(ctx context.Context, guard *idem.Guard, hints idem.RetryHints, msg docsMessage) string {
	pay := func(ctx context.Context, msg docsMessage) (idem.Response, error) {
		return idem.Response{Status: msg.status, Body: []byte("paid")}, nil
	}
	ack := func(resp idem.Response) string { return fmt.Sprintf("ack %d %s", resp.Status, resp.Body) }
	redeliver := func(after time.Duration, why string) string {
		if after > 0 { // the broker hides the message that long
			return "redeliver later (" + why + ")"
		}
		return "redeliver now (" + why + ")"
	}
	deadLetter := func(why string) string { return "dead letter (" + why + ")" }

	req := idem.Request{Scope: msg.Tenant, Key: msg.ID, Fingerprint: idem.HashParts([]byte(msg.Topic), msg.Body)}
	resp, outcome, err := guard.Do(ctx, req, func(ctx context.Context) (idem.Response, error) {
		return pay(ctx, msg) // runs at most once per (tenant, message id)
	})
	d := idem.Classify(outcome, err, hints) // hints: pgidem's Service.RetryHints(), the reconciler's pace
	switch d.Slug {
	case "": // the work ran, or the answer of the first execution is replayed
		if outcome == idem.OutcomeExecuted || outcome == idem.OutcomeReplayed {
			return ack(resp)
		}
		return redeliver(0, outcome.String()) // ran without a stored answer, or released
	case idem.ProblemInProgress, idem.ProblemPending, idem.ProblemServiceUnavailable:
		return redeliver(d.RetryAfter, d.Slug) // did not run; the same message may succeed later
	}
	return deadLetter(d.Slug) // a reused or invalid key, no tenant: a bug of the sender
}

// Guard.Do's contract, outcome first, in a queue consumer: a redelivered
// message is answered from the store; a payment that answered 504 holds its
// key until reconciliation; a key reused with another payload is refused.
func ExampleGuard_Do_outcomes() {
	ctx := context.Background()
	store := idemtest.NewMemStore(nil) // PostgreSQL in a service: durable.New
	guard, err := idem.New(store, &idem.Config{Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	// A pgidem Service derives them from the reconciler's pace; the
	// defaults here.
	hints := idem.RetryHints{}
	ok := docsMessage{Tenant: "tenant-7", ID: "msg-1", Topic: "invoice.pay", Body: []byte(`{"amount":4200}`), status: 200}
	fmt.Println(consume(ctx, guard, hints, ok))
	fmt.Println(consume(ctx, guard, hints, ok)) // redelivered
	other := ok
	other.Body = []byte(`{"amount":9900}`)
	fmt.Println(consume(ctx, guard, hints, other))

	timeout := docsMessage{Tenant: "tenant-7", ID: "msg-2", Topic: "invoice.pay", Body: []byte(`{"amount":100}`), status: 504}
	fmt.Println(consume(ctx, guard, hints, timeout))
	fmt.Println(consume(ctx, guard, hints, timeout))
	store.Age("tenant-7", "msg-2", guard.MaxHold()+time.Second) // no request can still be running
	fmt.Println(consume(ctx, guard, hints, timeout))

	fmt.Println(consume(ctx, guard, hints, docsMessage{ID: "msg-3", Topic: "invoice.pay", status: 200}))
	// Output:
	// ack 200 paid
	// ack 200 paid
	// dead letter (idempotency-key-reused)
	// redeliver now (executed_unstored)
	// redeliver later (request-in-progress)
	// redeliver later (request-pending)
	// dead letter (unauthenticated)
}

// The hybrid strategy: a Redis lease in front of the durable claim, with a
// Redis client set up as the lock needs it.
func ExampleNew_hybrid() {
	ctx := context.Background()
	store := idemtest.NewMemStore(nil) // PostgreSQL in a service: durable.New
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	defer setenv("REDIS_ADDR", mr.Addr())()

	rdb := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true,                   // honour the lock's per-call deadline; lock.New refuses a client without it
		MaxRetries:            -1,                     // no resend; lock.New refuses a client that retries
		DialerRetries:         1,                      // one dial per attempt (go-redis makes 5): a refused connection fails at once
		DialTimeout:           250 * time.Millisecond, // shorter than the lock's Timeout (500 ms)
	})
	defer rdb.Close()
	locker, err := lock.New(rdb, nil) // prefix "idem:", TTL 30 s, 500 ms per Redis call
	if err != nil {
		log.Fatal(err)
	}
	guard, err := idem.New(store, &idem.Config{Lock: locker})
	if err != nil {
		log.Fatal(err)
	}
	// At exit, before the deferred rdb.Close: send the answers' copies
	// still queued for Redis.
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := guard.Shutdown(sctx); err != nil {
			log.Print(err)
		}
	}()

	req := idem.Request{Scope: "user-42", Key: "k1", Fingerprint: idem.HashParts([]byte("pay"))}
	work := func(ctx context.Context) (idem.Response, error) { return idem.Response{Status: 201}, nil }
	for range 2 {
		_, out, err := guard.Do(ctx, req, work)
		fmt.Println(guard.Strategy(), out, err)
	}
	fmt.Println("lease:", mr.Exists(locker.Key("user-42", "k1")))
	// Output:
	// hybrid executed <nil>
	// hybrid replayed <nil>
	// lease: true
}

// A custom fingerprint that leaves out a tracking parameter the client
// changes between retries: the retry is still recognised and replayed.
func ExampleMiddlewareConfig_fingerprint() {
	guard, err := idem.New(idemtest.NewMemStore(nil), &idem.Config{Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	runs := 0
	createOrder := func(w http.ResponseWriter, r *http.Request) { runs++; w.WriteHeader(http.StatusCreated) }
	scope := func(r *http.Request) (string, bool) { return userID(r.Context()) }

	fingerprint := func(r *http.Request, body []byte) idem.Fingerprint {
		q := r.URL.Query()
		q.Del("utm_source") // changes between retries, and never changes the order
		return idem.HashRequest(r.Method, r.URL.EscapedPath()+"?"+q.Encode(), body)
	}
	h := guard.Middleware(scope, &idem.MiddlewareConfig{Fingerprint: fingerprint})(http.HandlerFunc(createOrder))

	srv := httptest.NewServer(authenticate(h))
	defer srv.Close()
	for _, src := range []string{"mail", "push"} {
		resp := docsPost(srv.URL+"/orders?utm_source="+src, "key-1", `{"hold_ids":[88211]}`)
		fmt.Printf("%d replayed=%q\n", resp.StatusCode, resp.Header.Get(idem.HeaderReplayed))
	}
	fmt.Println("runs:", runs)
	// Output:
	// 201 replayed=""
	// 201 replayed="true"
	// runs: 1
}

// A retry that arrives while its first request still runs waits for the
// answer (woken by PostgreSQL LISTEN/NOTIFY) instead of getting 409.
func ExampleMiddlewareConfig_wait() {
	ctx := context.Background()
	dbURL, drop := docsDatabase(ctx)
	defer drop()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := durable.Migrate(ctx, pool, nil); err != nil {
		log.Fatal(err)
	}
	var mu sync.Mutex
	runs := 0
	createOrder := func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		runs++
		mu.Unlock()
		time.Sleep(300 * time.Millisecond) // the payment call
		w.WriteHeader(http.StatusCreated)
	}
	scope := func(r *http.Request) (string, bool) { return userID(r.Context()) }
	mux := http.NewServeMux()

	store, err := durable.New(pool, &durable.Config{Notify: true}) // every instance announces answers
	if err != nil {
		log.Fatal(err)
	}
	listener, err := durable.NewListener(ctx, store, pool) // one LISTEN connection per process
	if err != nil {
		log.Fatal(err)
	}
	defer listener.Close()
	guard, err := idem.New(store, &idem.Config{Waiter: listener})
	if err != nil {
		log.Fatal(err)
	}
	mux.Handle("POST /orders", guard.Middleware(scope, &idem.MiddlewareConfig{Wait: 5 * time.Second})(http.HandlerFunc(createOrder)))
	// or, in the core: guard.Do(ctx, req, work, idem.WaitFor(5*time.Second))

	srv := httptest.NewServer(authenticate(mux))
	defer srv.Close()
	var wg sync.WaitGroup
	answers := make([]string, 2)
	for i := range answers {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 100 * time.Millisecond) // the retry comes 100 ms later
			resp := docsPost(srv.URL+"/orders", "key-1", `{"hold_ids":[88211]}`)
			answers[i] = fmt.Sprint(resp.StatusCode, " replayed=", resp.Header.Get(idem.HeaderReplayed) == "true")
		})
	}
	wg.Wait()
	slices.Sort(answers)
	fmt.Println(strings.Join(answers, "\n"))
	mu.Lock()
	defer mu.Unlock()
	fmt.Println("runs:", runs)
	// Output:
	// 201 replayed=false
	// 201 replayed=true
	// runs: 1
}

// The transactional join: the handler writes its order and the answer in one
// PostgreSQL transaction, so both commit or neither does.
func ExampleComplete() {
	ctx := context.Background()
	dbURL, drop := docsDatabase(ctx)
	defer drop()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := durable.Migrate(ctx, pool, nil); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (public_id text PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}
	store, err := durable.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	guard, err := idem.New(store, &idem.Config{Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}

	createOrder := func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		intent := idem.ExecutionFromContext(ctx).Intent
		orderID := idem.DeriveID("ord_", "order", intent) // the request's and the reconciler's; new after expiry
		resp := idem.Response{
			Status: http.StatusCreated,
			Header: http.Header{"Location": {"/orders/" + orderID}, "Content-Type": {"application/json"}},
			Body:   []byte(`{"id":"` + orderID + `"}`),
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO orders (public_id) VALUES ($1)`, orderID); err != nil {
				return err
			}
			return idem.Complete(ctx, tx, resp) // the answer commits with the order, or neither does
		})
		if err != nil {
			// Not committed: a 5xx keeps the key in progress until reconciled.
			http.Error(w, "order not recorded", http.StatusInternalServerError)
			return
		}
		resp.Write(w)
	}

	scope := func(r *http.Request) (string, bool) { return userID(r.Context()) }
	srv := httptest.NewServer(authenticate(guard.Middleware(scope, nil)(http.HandlerFunc(createOrder))))
	defer srv.Close()
	first := docsPost(srv.URL+"/orders", "key-1", `{"hold_ids":[88211]}`)
	retry := docsPost(srv.URL+"/orders", "key-1", `{"hold_ids":[88211]}`)
	var orders int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders); err != nil {
		log.Fatal(err)
	}
	fmt.Println(first.StatusCode, strings.HasPrefix(first.Header.Get("Location"), "/orders/ord_"))
	fmt.Println(retry.StatusCode, retry.Header.Get(idem.HeaderReplayed), retry.Header.Get("Location") == first.Header.Get("Location"))
	fmt.Println("orders:", orders)
	// Output:
	// 201 true
	// 201 true true
	// orders: 1
}

// The key a service sends to its payment provider: derived from the intent,
// so every execution of the intent, and its reconciler, send the same one,
// and a key reused after expiry (a new intent) sends a new one.
func ExampleDownstreamKey() {
	ctx := context.Background()
	store := idemtest.NewMemStore(nil)
	guard, err := idem.New(store, &idem.Config{Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	var sent []string // the provider's idempotency keys
	work := func(ctx context.Context) (idem.Response, error) {
		intent := idem.ExecutionFromContext(ctx).Intent
		orderID := idem.DeriveID("ord_", "order", intent)       // the same in every execution of the intent
		paymentKey, err := idem.DownstreamKey("order", orderID) // "order-ord_...": the provider's idempotency key
		if err != nil {
			return idem.Response{}, err
		}
		sent = append(sent, paymentKey)
		return idem.Response{Status: http.StatusCreated}, nil
	}

	req := idem.Request{Scope: "user-42", Key: "key-1", Fingerprint: idem.HashParts([]byte("order"))}
	_, out, _ := guard.Do(ctx, req, work)
	fmt.Println(out, strings.HasPrefix(sent[0], "order-ord_"), len(sent[0]))
	store.Age("user-42", "key-1", store.Retention()+time.Second) // a day later, the same key
	_, out, _ = guard.Do(ctx, req, work)
	fmt.Println(out, "new key:", sent[1] != sent[0])
	_, err = idem.DownstreamKey("order", "")
	fmt.Println(err)
	// Output:
	// executed true 36
	// executed new key: true
	// idem: downstream key: empty kind or id
}
