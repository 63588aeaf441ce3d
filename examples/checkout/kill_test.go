package main

// Crash injection: a real checkout process is killed with SIGKILL while
// orders are mid-work, and a new process on the same database (and, for the
// hybrid strategy, the same Redis) takes over. Every execution holds a
// durable row, so the killed requests leave their keys in progress; retries
// get 409 until the reconciler has asked the provider what happened and
// settled (the charge was made) or released (it was not) each key.
//
// Two kinds of intents are killed:
//
//   - "charged": the provider has performed the charge, but the answer is not
//     stored yet. The test holds a row lock on the order, so the request
//     blocks in its final transaction (order update + idem.Complete) after
//     the charge; the kill lands in that window. The reconciler must settle
//     the key with 201 and nothing may be charged again.
//   - "in flight": the charge call is still in the provider's latency, so the
//     provider never receives it. The reconciler must release the key; the
//     next retry charges once.
//
// The test keeps the default -work-timeout and -store-timeout, so the
// service's MaxHold is 46.5s and its reconciler (-reconcile-after must exceed that) cannot act within a
// test's time. The test therefore runs the service's reconciler path itself:
// reconcile.New over the same durable store with a guard whose WorkTimeout is
// short, and the service's own resolve (checkout.resolve). It only acts on
// the rows the killed process left behind (their owner tokens are listed
// right after the kill): that process is dead, so none of them can still be
// running, whatever the MinAge, and the test moves their deadline
// (hold_until) to the kill, as the passing of the service's MaxHold would.

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/heavy"
	"github.com/idemguard/idem/internal/testdb"
	"github.com/idemguard/idem/internal/testredis"
	"github.com/idemguard/idem/reconcile"
)

// proc is the checkout command running in a subprocess (the test binary
// re-executed with runMainEnv=1).
type proc struct {
	*app
	cmd    *exec.Cmd
	done   chan struct{} // closed when cmd.Wait has returned
	err    error         // cmd.Wait's, once done is closed
	stdout *readyWriter
}

// startProc starts the checkout command with args and waits until it
// listens. It is killed, if still running, when t ends.
func startProc(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	p := &proc{cmd: cmd, done: make(chan struct{}), stdout: newReadyWriter()}
	stderr := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = p.stdout, stderr
	cmd.WaitDelay = 5 * time.Second // bounds the copy of the pipes after exit
	require.NoError(t, cmd.Start())
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	transport := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(func() {
		transport.CloseIdleConnections()
		_ = cmd.Process.Kill() // an error: it has exited already
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			t.Errorf("process %s did not exit within 10s of SIGKILL", name)
		}
		if t.Failed() {
			t.Logf("process %s log:\n%s", name, stderr)
		}
	})
	select {
	case addr := <-p.stdout.addr:
		p.app = &app{base: "http://" + addr, client: &http.Client{Transport: transport, Timeout: 20 * time.Second}, log: stderr}
		return p
	case <-p.done:
		t.Fatalf("process %s exited before listening: %v\n%s", name, p.err, stderr)
	case <-time.After(30 * time.Second):
		t.Fatalf("process %s did not start within 30s\n%s", name, stderr)
	}
	return nil
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Kill())
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the process did not die within 10s of SIGKILL")
	}
}

// stop asks the process to shut down (SIGTERM) and requires a clean exit.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.done:
		require.NoError(t, p.err, "exit status after SIGTERM")
	case <-time.After(20 * time.Second):
		t.Fatal("the process did not stop within 20s of SIGTERM")
	}
}

func TestFaultKill9MidWork(t *testing.T) {
	heavy.Gate(t) // service processes killed and restarted
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
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			testKill9MidWork(t, s.name, s.args(t))
		})
	}
}

// killIntent is one client's order, sent to the process that dies and
// retried on the next one.
type killIntent struct {
	user, key, body string
	charged         bool // the kill lands after the provider charged

	final    reply // the first final answer
	finalErr error // the last transport error, when no final answer came
	statuses map[int]int
	errs     int
}

func testKill9MidWork(t *testing.T, strategy string, strategyArgs []string) {
	const (
		latency   = 1500 * time.Millisecond // the provider's
		nCharged  = 3                       // killed after the charge, before the answer is stored
		nInFlight = 3                       // killed while the charge call is in the provider's latency
		finalIn   = 25 * time.Second        // bound on the recovery
	)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Second)
	defer cancel()

	pool := testdb.Pool(t)
	schema := testdb.Schema(t, pool)
	args := append([]string{
		"-addr", "127.0.0.1:0", "-database-url", testDatabaseURL(t), "-schema", schema,
		"-work", latency.String(),
		// The service's own reconciler runs often, but cannot act on a key
		// younger than its MinAge (1m, above the guard's MaxHold of 46.5s).
		"-reconcile-every", "200ms",
	}, strategyArgs...)

	var intents []*killIntent
	for i := range nCharged + nInFlight {
		intents = append(intents, &killIntent{
			user: newUser(), key: newKey(), body: orderBody("pm_card_visa", int64(88000+i)),
			charged: i < nCharged, statuses: map[int]int{},
		})
	}
	if strategy == "hybrid" {
		deleteLeasesAtCleanup(t, func(del func(user, key string)) {
			for _, in := range intents {
				del(in.user, in.key)
			}
		})
	}

	// What the test reads of the example's tables.
	orders, err := newOrderStore(ctx, pool, schema)
	require.NoError(t, err)
	payrail, err := NewPayrail(ctx, pool, schema, 0)
	require.NoError(t, err)
	ordersOf := func(in *killIntent) []Order {
		rows, err := pool.Query(ctx, `SELECT `+orderColumns+` FROM `+orders.table+` WHERE user_id = $1 AND idempotency_key = $2 ORDER BY created_at`, in.user, in.key)
		require.NoError(t, err)
		list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Order, error) { return scanOrder(row) })
		require.NoError(t, err)
		return list
	}
	waitFor := func(what string, within time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(within)
		for !cond() {
			require.True(t, time.Now().Before(deadline), "waited %v for %s", within, what)
			time.Sleep(5 * time.Millisecond)
		}
	}
	charged := func(o Order) bool {
		_, found, err := payrail.Lookup(ctx, o.paymentKey())
		require.NoError(t, err)
		return found
	}

	// Process A.
	a := startProc(t, "A", args...)
	var sent sync.WaitGroup
	var killedErrs, killedAnswers int
	var killedMu sync.Mutex
	send := func(in *killIntent) {
		sent.Go(func() {
			r, err := a.call(http.MethodPost, "/orders", in.user, in.key, in.body)
			killedMu.Lock()
			defer killedMu.Unlock()
			if err != nil {
				killedErrs++
				return
			}
			killedAnswers++
			t.Errorf("intent %s answered %d before the kill: %s", in.key, r.Status, r.Body)
		})
	}
	// The "charged" intents: hold their orders' rows so that each request,
	// once charged, blocks in its final transaction (the order's update),
	// before its answer is stored.
	for _, in := range intents[:nCharged] {
		send(in)
	}
	lockTx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lockTx.Rollback(context.WithoutCancel(ctx)) }()
	for _, in := range intents[:nCharged] {
		waitFor("the order of a charged intent", 10*time.Second, func() bool { return len(ordersOf(in)) == 1 })
		var id string
		require.NoError(t, lockTx.QueryRow(ctx, `SELECT id FROM `+orders.table+` WHERE user_id = $1 AND idempotency_key = $2 FOR UPDATE`, in.user, in.key).Scan(&id))
	}
	for _, in := range intents[:nCharged] {
		waitFor("the charge of a charged intent", 10*time.Second, func() bool { return charged(ordersOf(in)[0]) })
	}
	// The "in flight" intents: their charge calls wait out the provider's
	// latency, which the kill interrupts.
	for _, in := range intents[nCharged:] {
		send(in)
	}
	for _, in := range intents[nCharged:] {
		waitFor("the order of an in-flight intent", 10*time.Second, func() bool { return len(ordersOf(in)) == 1 })
	}
	time.Sleep(200 * time.Millisecond) // well inside the charge call's 1.5s
	a.kill(t)
	killed := time.Now()
	sent.Wait()
	require.NoError(t, lockTx.Rollback(ctx)) // the dead process's transactions roll back
	require.Equal(t, nCharged+nInFlight, killedErrs, "every client of the killed process got a transport error")

	// The kill landed where intended: charged intents have their charge, in-flight ones none.
	for _, in := range intents {
		list := ordersOf(in)
		require.Len(t, list, 1)
		require.Equal(t, in.charged, charged(list[0]), "intent %s (charged=%v): the kill did not land where intended", in.key, in.charged)
		require.Equal(t, OrderPendingPayment, list[0].Status, "the killed request recorded nothing after its order")
	}

	// Every killed request left its durable row in progress.
	store, err := durable.New(pool, &durable.Config{Schema: schema})
	require.NoError(t, err)
	killedOwners := map[idem.Token]bool{}
	killedOwnerOf := map[string]idem.Token{} // by key
	for _, in := range intents {
		rec, err := store.Get(ctx, in.user, in.key)
		require.NoError(t, err, "every killed execution left its row")
		require.True(t, rec.InProgress(), "every killed execution left its row in progress")
		killedOwners[rec.Owner] = true
		killedOwnerOf[in.key] = rec.Owner
	}
	// Each row carries its owner's deadline (the claim + the service's
	// MaxHold, 46.5s), before which no reconciler acts on it. The process
	// is dead, so its executions have ended: say so, as time would.
	var dead [][]byte
	for owner := range killedOwners {
		dead = append(dead, owner[:])
	}
	_, err = pool.Exec(ctx, `UPDATE `+store.Table()+` SET hold_until = now() WHERE owner_token = ANY($1)`, dead)
	require.NoError(t, err)

	// Process B, on the same schema (and Redis).
	b := startProc(t, "B", args...)

	// The reconciler path of the service, run by the test (see the file's
	// comment): a guard with a short WorkTimeout, hence a short MaxHold.
	recLog := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(recLog, nil))
	recGuard, err := idem.New(store, &idem.Config{WorkTimeout: 100 * time.Millisecond, StoreTimeout: 200 * time.Millisecond, Logger: logger})
	require.NoError(t, err)
	c := &checkout{payrail: payrail, orders: orders, render: renderProblem, log: logger}
	var (
		recMu      sync.Mutex
		recResult  reconcile.Result
		recVisited = map[idem.Token]reconcile.Verdict{}
	)
	rec, err := reconcile.New(recGuard, store, pool, func(ctx context.Context, it reconcile.Item) (reconcile.Decision, error) {
		owner := it.Intent
		if !killedOwners[owner] {
			// A row of process B: it may be running; leave it alone.
			return reconcile.Decision{}, errors.New("not a row of the killed process")
		}
		d, err := c.resolve(ctx, it)
		if err == nil {
			recMu.Lock()
			recVisited[owner] = d.Verdict
			recMu.Unlock()
		}
		return d, err
	}, &reconcile.Config{
		Interval: 50 * time.Millisecond, MinAge: recGuard.MaxHold() + 100*time.Millisecond,
		OnResult: func(res reconcile.Result, _ time.Duration, _ error) {
			recMu.Lock()
			defer recMu.Unlock()
			recResult.Settled += res.Settled
			recResult.Released += res.Released
			recResult.Unknown += res.Unknown
			recResult.Skipped += res.Skipped
			recResult.Errors += res.Errors
		},
	})
	require.NoError(t, err)
	recCtx, stopRec := context.WithCancel(ctx)
	var recDone sync.WaitGroup
	recDone.Go(func() { _ = rec.Run(recCtx) })
	stopReconciler := sync.OnceFunc(func() { stopRec(); recDone.Wait() })
	defer stopReconciler()
	defer func() {
		if t.Failed() {
			t.Logf("test reconciler log:\n%s", recLog)
		}
	}()

	// Retry every intent on B until it gets a final answer.
	final := func(r reply) bool {
		return r.Status >= 200 && r.Status < 500 && r.Status != http.StatusConflict && r.Status != http.StatusTooManyRequests
	}
	deadline := killed.Add(finalIn)
	var retries sync.WaitGroup
	var lastFinal time.Time
	var lastMu sync.Mutex
	for _, in := range intents {
		retries.Go(func() {
			for attempt := 0; ; attempt++ {
				r, err := b.call(http.MethodPost, "/orders", in.user, in.key, in.body)
				if err != nil {
					in.errs++
					in.finalErr = err
				} else {
					in.statuses[r.Status]++
					if final(r) {
						in.final = r
						lastMu.Lock()
						if now := time.Now(); now.After(lastFinal) {
							lastFinal = now
						}
						lastMu.Unlock()
						return
					}
				}
				if time.Now().After(deadline) || ctx.Err() != nil {
					return
				}
				time.Sleep(time.Duration(40+attempt%3*10) * time.Millisecond)
			}
		})
	}
	retries.Wait()
	stopReconciler()
	recovered := lastFinal.Sub(killed)

	// Every intent is final, none answered 500, and each final answer
	// replays unchanged.
	var (
		created, conflicts, fives, transport int
		maxChargesPerIntent, orphanOrders    int
	)
	for _, in := range intents {
		conflicts += in.statuses[http.StatusConflict]
		fives += in.statuses[http.StatusInternalServerError]
		transport += in.errs
		require.NotZero(t, in.final.Status, "intent %s (charged=%v) got no final answer within %v: statuses %v, last error %v",
			in.key, in.charged, finalIn, in.statuses, in.finalErr)
		require.Zero(t, in.statuses[http.StatusInternalServerError], "intent %s answered 500: %v", in.key, in.statuses)
		require.Equal(t, http.StatusCreated, in.final.Status, "intent %s (charged=%v): %s", in.key, in.charged, in.final.Body)
		created++

		replay := b.postOrder(t, in.user, in.key, in.body)
		require.True(t, replay.replayed(), "intent %s: the retry after the final answer was not a replay: %d %s", in.key, replay.Status, replay.Body)
		require.Equal(t, in.final.Status, replay.Status, "intent %s", in.key)
		require.Equal(t, string(in.final.Body), string(replay.Body), "intent %s", in.key)
		require.Equal(t, in.final.Header.Get("Location"), replay.Header.Get("Location"), "intent %s", in.key)

		// At most one charge per intent, over every order it created, and
		// the answer names the charged order and its charge.
		answered := decodeOrderReply(t, in.final)
		require.Equal(t, string(OrderPaid), answered.Status)
		n := 0
		for _, o := range ordersOf(in) {
			ch, found, err := payrail.Lookup(ctx, o.paymentKey())
			require.NoError(t, err)
			if !found {
				if o.ID != answered.ID {
					// The killed request's order, released: nothing was
					// charged for it, and the reconciler said so.
					require.Equal(t, OrderAbandoned, o.Status, "intent %s: the released order's state", in.key)
					orphanOrders++
				}
				continue
			}
			n++
			require.Equal(t, answered.ID, o.ID, "intent %s: the charged order is not the one answered", in.key)
			require.Equal(t, ch.ID, answered.ChargeID, "intent %s", in.key)
			require.Equal(t, OrderPaid, o.Status, "intent %s: the charged order's state", in.key)
		}
		require.LessOrEqual(t, n, 1, "intent %s was charged %d times", in.key, n)
		require.Equal(t, 1, n, "intent %s answered 201 but nothing was charged", in.key)
		maxChargesPerIntent = max(maxChargesPerIntent, n)

		// The reconciler settled the charged intents and released the others.
		want := reconcile.NothingHappened
		if in.charged {
			want = reconcile.Settled
		}
		killedOwner := killedOwnerOf[in.key]
		recMu.Lock()
		got, ok := recVisited[killedOwner]
		recMu.Unlock()
		require.True(t, ok, "intent %s: the reconciler never resolved the killed row", in.key)
		require.Equal(t, want, got, "intent %s (charged=%v): verdict", in.key, in.charged)
	}
	count, attempts := b.chargeCounts(t)
	require.Equal(t, created, count, "the provider's charges equal the intents that ended 201")
	require.Equal(t, len(intents), attempts, "one charge call reached the provider per intent: no replay, no second execution")

	recMu.Lock()
	res := recResult
	recMu.Unlock()
	t.Logf("RELIABILITY scenario=kill-9-mid-work strategy=%s intents=%d killed_after_charge=%d killed_in_flight=%d created=%d charges=%d attempts=%d max_charges_per_intent=%d http_409=%d http_500=%d client_errors_at_kill=%d transport_errors_on_retry=%d reconciled_settled=%d reconciled_released=%d abandoned_orders=%d all_final_in=%v",
		strategy, len(intents), nCharged, nInFlight, created, count, attempts, maxChargesPerIntent, conflicts, fives, killedErrs, transport,
		res.Settled, res.Released, orphanOrders, recovered.Round(time.Millisecond))
	require.Equal(t, nCharged, res.Settled)
	require.Equal(t, nInFlight, res.Released)

	b.stop(t)
}
