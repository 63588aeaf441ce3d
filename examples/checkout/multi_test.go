package main

// A storm across instances: four checkout processes (separate processes,
// each with its own pool, guard and, for the hybrid strategy, its own Redis
// client) share one PostgreSQL schema and, for the hybrid strategy, one
// Redis. Every intent is sent at once by several clients, each to a different
// instance, and retried until it has a final answer. Whatever instance a
// request lands on, each intent must run once in the whole fleet: one order,
// one charge call, and the same answer, replayed, everywhere.

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/internal/heavy"
	"github.com/idemguard/idem/internal/testdb"
	"github.com/idemguard/idem/internal/testredis"
)

func TestStormAcrossInstances(t *testing.T) {
	heavy.Gate(t) // four service processes
	t.Parallel()
	for _, s := range []struct {
		name string
		args func(t *testing.T) []string
	}{
		{"table", func(*testing.T) []string { return []string{"-strategy", "table"} }},
		{"hybrid", func(t *testing.T) []string {
			testredis.Client(t) // skips, or fails under CI=true, without Redis
			return []string{"-strategy", "hybrid", "-redis-addr", testredis.Addr()}
		}},
	} {
		t.Run("strategy="+s.name, func(t *testing.T) {
			t.Parallel()
			testStormAcrossInstances(t, s.name, s.args(t))
		})
	}
}

// instance is one checkout process of a fleet.
type instance struct {
	*proc
	name    string
	stopped bool // the test has asked it to stop
}

// stopInstances sends SIGTERM to every instance still running, then waits
// for each to exit cleanly; one that has not exited within 20s is killed.
// An instance that exited before it was asked to is an error.
func stopInstances(t *testing.T, instances ...*instance) {
	t.Helper()
	var signalled []*instance
	for _, in := range instances {
		if in.stopped {
			continue
		}
		in.stopped = true
		select {
		case <-in.done:
			t.Errorf("instance %s exited before it was stopped: %v", in.name, in.err)
			continue
		default:
		}
		if err := in.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Errorf("instance %s: SIGTERM: %v", in.name, err)
		}
		signalled = append(signalled, in)
	}
	deadline := time.After(20 * time.Second)
	for _, in := range signalled {
		select {
		case <-in.done:
			if in.err != nil {
				t.Errorf("instance %s: exit status after SIGTERM: %v", in.name, in.err)
			}
		case <-deadline:
			t.Errorf("instance %s did not stop within 20s of SIGTERM; killing it", in.name)
			_ = in.cmd.Process.Kill()
			<-in.done // startProc's WaitDelay bounds this
		}
	}
}

// stormIntent is one order, sent at once by several clients.
type stormIntent struct {
	user, key, body string
	finals          []reply // by client; zero Status: no final answer
}

func testStormAcrossInstances(t *testing.T, strategy string, strategyArgs []string) {
	const (
		nInstances = 4
		nIntents   = 40
		nClients   = 5                      // per intent, each starting on a different instance
		latency    = 200 * time.Millisecond // the provider's: the copies of an intent overlap
		stormFor   = 15 * time.Second       // bound on the storm, retries included
	)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	pool := testdb.Pool(t)
	schema := testdb.Schema(t, pool)
	args := append([]string{
		"-addr", "127.0.0.1:0", "-database-url", testDatabaseURL(t), "-schema", schema,
		"-work", latency.String(),
	}, strategyArgs...)

	intents := make([]*stormIntent, nIntents)
	for i := range intents {
		intents[i] = &stormIntent{
			user: newUser(), key: newKey(), body: orderBody("pm_card_visa", int64(88000+i), int64(89000+i)),
			finals: make([]reply, nClients),
		}
	}
	if strategy == "hybrid" {
		deleteLeasesAtCleanup(t, func(del func(user, key string)) {
			for _, in := range intents {
				del(in.user, in.key)
			}
		})
	}

	// The fleet. Each instance is stopped (SIGTERM) at cleanup, before
	// startProc's own cleanup kills whatever is left and the schema is
	// dropped.
	fleet := make([]*instance, 0, nInstances)
	for i := range nInstances {
		name := fmt.Sprintf("%s-%d", strategy, i)
		in := &instance{proc: startProc(t, name, args...), name: name}
		fleet = append(fleet, in)
		t.Cleanup(func() { stopInstances(t, in) })
	}
	t.Cleanup(func() { stopInstances(t, fleet...) }) // all at once, first

	// The storm: every client of every intent starts at once. Client c of
	// intent i sends its copy to instance (i+c) mod 4 and each retry to the
	// next instance, until it gets a final answer or the storm's time is up.
	var (
		mu                        sync.Mutex
		requests, transportErrors int
		statuses                  = map[int]int{}
	)
	retryable := func(status int) bool {
		return status == http.StatusConflict || status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable
	}
	began := time.Now()
	deadline := began.Add(stormFor)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i, in := range intents {
		for c := range nClients {
			wg.Go(func() {
				<-gate
				for attempt := 0; ; attempt++ {
					target := fleet[(i+c+attempt)%nInstances]
					r, err := target.call(http.MethodPost, "/orders", in.user, in.key, in.body)
					mu.Lock()
					requests++
					if err != nil {
						transportErrors++
					} else {
						statuses[r.Status]++
					}
					mu.Unlock()
					if err == nil && !retryable(r.Status) {
						in.finals[c] = r
						return
					}
					if time.Now().After(deadline) || ctx.Err() != nil {
						return
					}
					time.Sleep(time.Duration(20+(attempt+c)%4*10) * time.Millisecond)
				}
			})
		}
	}
	close(gate)
	wg.Wait()
	took := time.Since(began)

	// Every client of every intent got the same final 201, and exactly one
	// of those answers was the execution's own (the others replays).
	for _, in := range intents {
		first := in.finals[0]
		originals := 0
		for c, r := range in.finals {
			require.NotZero(t, r.Status, "intent %s, client %d: no final answer within %v", in.key, c, stormFor)
			require.Equal(t, http.StatusCreated, r.Status, "intent %s, client %d: %s", in.key, c, r.Body)
			require.Equal(t, string(first.Body), string(r.Body), "intent %s, client %d: another answer", in.key, c)
			require.Equal(t, first.Header.Get("Location"), r.Header.Get("Location"), "intent %s, client %d", in.key, c)
			require.NotEmpty(t, r.Header.Get("Location"), "intent %s, client %d", in.key, c)
			if !r.replayed() {
				originals++
			}
		}
		require.LessOrEqual(t, originals, 1, "intent %s: %d clients got an answer that was not a replay", in.key, originals)
	}
	require.Zero(t, statuses[http.StatusInternalServerError], "no 500 may escape: %v", statuses)

	// A further retry, on every instance, replays the same answer.
	for _, in := range intents {
		for _, inst := range fleet {
			r := inst.postOrder(t, in.user, in.key, in.body)
			require.Equal(t, http.StatusCreated, r.Status, "intent %s on %s: %s", in.key, inst.name, r.Body)
			require.True(t, r.replayed(), "intent %s on %s: not a replay", in.key, inst.name)
			require.Equal(t, string(in.finals[0].Body), string(r.Body), "intent %s on %s", in.key, inst.name)
			require.Equal(t, in.finals[0].Header.Get("Location"), r.Header.Get("Location"), "intent %s on %s", in.key, inst.name)
		}
	}

	// One order and one charge call per intent, over the whole fleet.
	orders, err := newOrderStore(ctx, pool, schema)
	require.NoError(t, err)
	ordersOf := map[[2]string][]string{} // (user, key) -> order ids
	rows, err := pool.Query(ctx, `SELECT user_id, idempotency_key, id FROM `+orders.table)
	require.NoError(t, err)
	for rows.Next() {
		var user, key, id string
		require.NoError(t, rows.Scan(&user, &key, &id))
		ordersOf[[2]string{user, key}] = append(ordersOf[[2]string{user, key}], id)
	}
	require.NoError(t, rows.Err())
	payrail, err := NewPayrail(ctx, pool, schema, 0)
	require.NoError(t, err)
	callsOf := map[string]int{} // payment key -> charge calls received
	rows, err = pool.Query(ctx, `SELECT idempotency_key, count(*) FROM `+payrail.attempts+` GROUP BY idempotency_key`)
	require.NoError(t, err)
	for rows.Next() {
		var key string
		var n int
		require.NoError(t, rows.Scan(&key, &n))
		callsOf[key] = n
	}
	require.NoError(t, rows.Err())
	maxExec := 0
	for _, in := range intents {
		ids := ordersOf[[2]string{in.user, in.key}]
		exec := 0
		for _, id := range ids {
			exec += callsOf[(&Order{ID: id}).paymentKey()]
		}
		maxExec = max(maxExec, exec, len(ids))
		answered := decodeOrderReply(t, in.finals[0])
		require.Equal(t, []string{answered.ID}, ids, "intent %s: one order, the one answered", in.key)
		require.Equal(t, 1, exec, "intent %s: charge calls received by the provider", in.key)
		require.Equal(t, string(OrderPaid), answered.Status, "intent %s", in.key)
		ch, found, err := payrail.Lookup(ctx, (&Order{ID: answered.ID}).paymentKey())
		require.NoError(t, err)
		require.True(t, found, "intent %s: answered 201 but nothing was charged", in.key)
		require.Equal(t, ch.ID, answered.ChargeID, "intent %s", in.key)
	}
	require.Len(t, ordersOf, nIntents, "no order outside the storm's intents")

	// Every instance reports the same provider: one charge per intent.
	var count, attempts int
	for _, inst := range fleet {
		count, attempts = inst.chargeCounts(t)
		require.Equal(t, nIntents, count, "charges performed, as seen by %s", inst.name)
		require.Equal(t, nIntents, attempts, "charge calls received, as seen by %s: no intent ran twice", inst.name)
	}

	mu.Lock()
	t.Logf("RELIABILITY scenario=storm-4-instances strategy=%s instances=%d intents=%d clients_per_intent=%d requests=%d charges=%d provider_calls=%d http_201=%d http_409=%d http_503=%d http_500=%d transport_errors=%d max_exec_per_intent=%d storm_took=%v",
		strategy, nInstances, nIntents, nClients, requests, count, attempts, statuses[http.StatusCreated], statuses[http.StatusConflict],
		statuses[http.StatusServiceUnavailable], statuses[http.StatusInternalServerError], transportErrors, maxExec, took.Round(time.Millisecond))
	mu.Unlock()

	stopInstances(t, fleet...)
}
