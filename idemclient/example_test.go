package idemclient_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/idemclient"
	"github.com/idemguard/idem/idemtest"
)

// A checkout client: the key is born with the buyer's click and kept with
// the intent, so that sending the order again (after a timeout, a restart,
// a second tab) gets the first answer, replayed, and never a second order.
func Example() {
	guard, err := idem.New(idemtest.NewMemStore(nil), nil) // the server: idem's middleware
	if err != nil {
		log.Fatal(err)
	}
	var orders atomic.Int32
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", orders.Add(1)))
		w.WriteHeader(http.StatusCreated)
	})
	scope := func(r *http.Request) (string, bool) {
		return strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	}
	srv := httptest.NewServer(guard.Middleware(scope, nil)(createOrder))
	defer srv.Close()

	client := &http.Client{Transport: idemclient.New(nil, nil)} // every default
	key := idemclient.NewKey()                                  // at the click, stored with the cart
	for range 2 {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"cart":42}`))
		if err != nil {
			log.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer user-1")
		req.Header.Set(idem.HeaderKey, key)
		resp, err := client.Do(req)
		if err != nil {
			log.Fatal(err) // an *idemclient.Error: send again later with the same key
		}
		resp.Body.Close()
		res := idemclient.ResultOf(resp)
		fmt.Println(resp.StatusCode, resp.Header.Get("Location"), "replayed:", res.Replayed, "attempts:", res.Attempts, "key kept:", res.Key == key)
	}
	fmt.Println("orders:", orders.Load())
	// Output:
	// 201 /orders/1 replayed: false attempts: 1 key kept: true
	// 201 /orders/1 replayed: true attempts: 1 key kept: true
	// orders: 1
}
