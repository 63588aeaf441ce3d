package idemtest_test

import (
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/idemtest"
	"github.com/idemguard/idem/lock"
)

// ordersHandler answers 201 and counts how many times it ran: the side effect
// that must happen once per key.
func ordersHandler(charges *int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		*charges++
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", *charges))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintln(w, `{"status":"paid"}`)
	})
}

// userScope is demo authentication: the bearer token is the user id.
func userScope(r *http.Request) (string, bool) {
	return strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
}

// post sends a guarded POST to h and prints what the client sees.
func post(h http.Handler, key, body string) {
	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer user-42")
	req.Header.Set(idem.HeaderKey, key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	resp := w.Result()
	fmt.Printf("%d location=%q replayed=%q\n", resp.StatusCode, resp.Header.Get("Location"), resp.Header.Get(idem.HeaderReplayed))
}

// A unit test of a guarded handler, without PostgreSQL: the in-memory store
// behind the Guard, httptest in front. The retry is replayed, a different
// body under the same key is refused, and the handler runs once.
func ExampleMemStore() {
	store := idemtest.NewMemStore(nil)
	guard, err := idem.New(store, &idem.Config{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		log.Fatal(err)
	}
	charges := 0
	h := guard.Middleware(userScope, nil)(ordersHandler(&charges))

	const key = "8e03978e-40d5-43e8-bc93-6894a57f9324"
	post(h, key, `{"hold_ids":[88211]}`)
	post(h, key, `{"hold_ids":[88211]}`) // the client's retry
	post(h, key, `{"hold_ids":[99999]}`) // a client bug: the key reused
	fmt.Println("charges:", charges)
	// Output:
	// 201 location="/orders/1" replayed=""
	// 201 location="/orders/1" replayed="true"
	// 422 location="" replayed=""
	// charges: 1
}

// The hybrid strategy in a unit test: miniredis holds the leases, the
// in-memory store the answers.
func ExampleMemStore_hybrid() {
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

	guard, err := idem.New(idemtest.NewMemStore(nil), &idem.Config{
		Lock:   locker,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		log.Fatal(err)
	}
	charges := 0
	h := guard.Middleware(userScope, nil)(ordersHandler(&charges))

	const key = "0b9c3f52-5d0e-4c4f-9d38-2a0c6f1e7a11"
	post(h, key, `{"hold_ids":[88211]}`)
	post(h, key, `{"hold_ids":[88211]}`)
	post(h, key, `{"hold_ids":[99999]}`)
	fmt.Println("charges:", charges)
	// Output:
	// 201 location="/orders/1" replayed=""
	// 201 location="/orders/1" replayed="true"
	// 422 location="" replayed=""
	// charges: 1
}

// Expiring one key without waiting: once its retention has passed, the same
// key is a new request and the handler runs again.
func ExampleMemStore_Age() {
	store := idemtest.NewMemStore(nil)
	guard, err := idem.New(store, &idem.Config{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		log.Fatal(err)
	}
	charges := 0
	h := guard.Middleware(userScope, nil)(ordersHandler(&charges))

	const key = "5f1d7a0e-9b7c-4e43-8f65-3c2d1b0a9e88"
	post(h, key, `{"hold_ids":[88211]}`)
	store.Age("user-42", key, store.Retention()+1)
	post(h, key, `{"hold_ids":[88211]}`)
	fmt.Println("charges:", charges)
	// Output:
	// 201 location="/orders/1" replayed=""
	// 201 location="/orders/2" replayed=""
	// charges: 2
}
