package main

// Fault injection over HTTP: the checkout service runs the hybrid strategy
// against a throwaway redis-server that is killed in the middle of a load of
// orders (with concurrent retries of the same intents) and restarted. The
// payment provider must have been called once per paid intent (no handler ran
// twice), every answer a client received as final must replay unchanged, no
// 500 may escape, and the service must serve new orders afterwards without a
// restart.

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/internal/faultproxy"
	"github.com/idemguard/idem/internal/tempserver"
)

func TestFaultRedisKilledUnderOrders(t *testing.T) {
	srv := tempserver.StartRedis(t)
	proxy := faultproxy.Start(t, srv.Addr())
	a := start(t, "-strategy", "hybrid", "-redis-addr", proxy.Addr(), "-work", "400ms")

	type intent struct {
		user, key, body string
		mu              sync.Mutex
		finals          []reply
	}
	var (
		mu        sync.Mutex
		intents   []*intent
		requests  int
		statuses  = map[int]int{}
		transport int
	)
	final := func(r reply) bool {
		return r.Status >= 200 && r.Status < 500 && r.Status != http.StatusConflict && r.Status != http.StatusTooManyRequests
	}
	drive := func(in *intent, deadline time.Time) {
		for attempt := 0; ; attempt++ {
			r, err := a.call(http.MethodPost, "/orders", in.user, in.key, in.body)
			mu.Lock()
			requests++
			if err != nil {
				transport++
			} else {
				statuses[r.Status]++
			}
			mu.Unlock()
			if err == nil && final(r) {
				in.mu.Lock()
				in.finals = append(in.finals, r)
				in.mu.Unlock()
				return
			}
			if time.Now().After(deadline) {
				return
			}
			time.Sleep(time.Duration(30+attempt%4*10) * time.Millisecond)
		}
	}

	// 6 clients for 2.5s; every other order is also sent by a second client
	// at the same time. Redis dies at 1s and is back at 1.6s.
	stop := time.Now().Add(2500 * time.Millisecond)
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			time.Sleep(time.Duration(w) * 70 * time.Millisecond) // spread the clients over the work's 400ms
			for i := 0; time.Now().Before(stop); i++ {
				in := &intent{user: fmt.Sprintf("user-%d", w), key: newKey(), body: orderBody("pm_card_visa", int64(88000+i))}
				mu.Lock()
				intents = append(intents, in)
				mu.Unlock()
				deadline := time.Now().Add(4 * time.Second)
				var twin sync.WaitGroup
				if i%2 == 0 {
					twin.Go(func() { drive(in, deadline) })
				}
				drive(in, deadline)
				twin.Wait()
			}
		})
	}
	time.Sleep(time.Second)
	require.NoError(t, srv.Kill())
	time.Sleep(600 * time.Millisecond)
	require.NoError(t, srv.Start())
	cleared := time.Now()
	var recovered time.Duration
	for i := 0; recovered == 0; i++ {
		in := &intent{user: "prober", key: newKey(), body: orderBody("pm_card_visa", int64(i+1))}
		mu.Lock()
		intents = append(intents, in)
		mu.Unlock()
		drive(in, time.Now()) // one attempt
		if len(in.finals) > 0 {
			recovered = time.Since(cleared)
			break
		}
		require.Less(t, time.Since(cleared), 10*time.Second, "the service did not recover")
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()

	// Every intent ends with a final answer, and its replay is what clients
	// were told.
	lost, paid := 0, 0
	for _, in := range intents {
		in.mu.Lock()
		finals := append([]reply(nil), in.finals...)
		in.mu.Unlock()
		if len(finals) == 0 {
			drive(in, time.Now().Add(5*time.Second))
			finals = in.finals
		}
		require.NotEmpty(t, finals, "intent %s never got a final answer", in.key)
		replay := a.postOrder(t, in.user, in.key, in.body)
		require.True(t, replay.replayed(), "status %d: %s", replay.Status, replay.Body)
		for _, f := range finals {
			if f.Status != replay.Status || string(f.Body) != string(replay.Body) || f.Header.Get("Location") != replay.Header.Get("Location") {
				lost++
				t.Errorf("intent %s: a client was told %d %s; the replay is %d %s", in.key, f.Status, f.Body, replay.Status, replay.Body)
			}
		}
		if replay.Status == http.StatusCreated {
			paid++
		}
	}
	charges, attempts := a.chargeCounts(t)
	require.Equal(t, paid, charges, "each paid order was charged exactly once")
	// Every execution calls the provider once: as many calls as charges
	// means no handler ran twice, the Redis loss notwithstanding (every
	// execution holds its durable row).
	require.Equal(t, charges, attempts, "no intent's handler reached the provider twice")
	mu.Lock()
	defer mu.Unlock()
	require.Zero(t, lost)
	t.Logf("RELIABILITY scenario=checkout-redis-killed  strategy=hybrid requests=%5d faults=  1 intents=%4d paid=%d charges=%d provider_calls=%d answers_lost=%d http_409=%d http_503=%d http_500=%d no_answer=%d recovered_in=%v",
		requests, len(intents), paid, charges, attempts, lost, statuses[http.StatusConflict],
		statuses[http.StatusServiceUnavailable], statuses[http.StatusInternalServerError], transport, recovered.Round(time.Millisecond))
	require.Zero(t, statuses[http.StatusInternalServerError], "no 500 may escape: %v", statuses)
}
