package idem_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
)

// withWait gives the Guard a Listener as its Waiter, and a retry of a running
// key 10s to wait for its answer.
func withWait(o *setupOpts) { o.wait = true; o.cfg.Wait = 10 * time.Second }

// withSubscribeSignal makes the Guard's Waiter send on subscribed each time
// a request subscribes, that is, starts to wait: tests open their gate on
// that signal, not after a sleep that hopes the waiter got there.
func withSubscribeSignal(subscribed chan struct{}) func(*setupOpts) {
	return func(o *setupOpts) {
		o.waiter = func(w idem.Waiter) idem.Waiter { return signalWaiter{w, subscribed} }
	}
}

// gate is a Work that blocks until opened, then answers resp.
type gate struct {
	started chan struct{}
	open    chan struct{}
	resp    idem.Response
	runs    counter
}

func newGate(resp idem.Response) *gate {
	return &gate{started: make(chan struct{}), open: make(chan struct{}), resp: resp}
}

func (g *gate) work(ctx context.Context) (idem.Response, error) {
	g.runs.n.Add(1)
	close(g.started)
	<-g.open
	return g.resp, nil
}

// A retry that finds its key running waits, woken by the answer's
// announcement, and replays it; the work runs once.
func TestWaitReplaysTheRunningAnswer(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		subscribed := make(chan struct{}, 1)
		b := setup(t, strategy, withWait, withSubscribeSignal(subscribed))
		ctx := context.Background()
		r := req("u", newKey(), "x")
		g := newGate(created("waited-for"))
		var first idem.Response
		var wg sync.WaitGroup
		wg.Go(func() { first, _, _ = b.guard.Do(ctx, r, g.work) })
		<-g.started

		type result struct {
			resp idem.Response
			out  idem.Outcome
			err  error
		}
		done := make(chan result, 1)
		go func() {
			resp, out, err := b.guard.Do(ctx, r, nil2xx(t))
			done <- result{resp, out, err}
		}()
		select {
		case res := <-done:
			t.Fatalf("the retry did not wait: %v %v", res.out, res.err)
		case <-subscribed: // the retry waits
		}
		close(g.open)
		res := <-done
		wg.Wait()
		require.NoError(t, res.err)
		require.Equal(t, idem.OutcomeReplayed, res.out)
		require.Equal(t, first.Header.Get("Location"), res.resp.Header.Get("Location"))
		require.EqualValues(t, 1, g.runs.n.Load())
		require.EqualValues(t, 1, b.guard.Stats().Waited)
	})
}

// The wait is bounded: past it, the retry is refused with 409 as without
// waiting, no earlier than the bound.
func TestWaitIsBounded(t *testing.T) {
	b := setup(t, "table", withWait, func(o *setupOpts) { o.cfg.Wait = 200 * time.Millisecond })
	ctx := context.Background()
	r := req("u", newKey(), "x")
	g := newGate(created("slow"))
	var wg sync.WaitGroup
	wg.Go(func() { _, _, _ = b.guard.Do(ctx, r, g.work) })
	defer wg.Wait()
	defer close(g.open)
	<-g.started
	start := time.Now()
	_, out, err := b.guard.Do(ctx, r, nil2xx(t))
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.Equal(t, idem.OutcomeInProgress, out)
	require.EqualValues(t, 1, b.guard.Stats().WaitTimeouts)
}

// signalWaiter tells when a request has subscribed, that is, waits.
type signalWaiter struct {
	idem.Waiter
	subscribed chan struct{}
}

func (w signalWaiter) Subscribe(scope, key string) (<-chan struct{}, func()) {
	wake, cancel := w.Waiter.Subscribe(scope, key)
	w.subscribed <- struct{}{}
	return wake, cancel
}

// At most so many requests wait (1024; 1 here); the next is refused at once.
func TestWaitersAreBounded(t *testing.T) {
	subscribed := make(chan struct{}, 8)
	b := setup(t, "table", withWait, func(o *setupOpts) {
		o.waiter = func(w idem.Waiter) idem.Waiter { return signalWaiter{w, subscribed} }
	})
	idem.SetMaxWaiters(b.guard, 1)
	ctx := context.Background()
	r := req("u", newKey(), "x")
	g := newGate(created("slow"))
	var wg sync.WaitGroup
	wg.Go(func() { _, _, _ = b.guard.Do(ctx, r, g.work) })
	<-g.started
	wg.Go(func() { _, _, _ = b.guard.Do(ctx, r, nil2xx(t)) })
	<-subscribed // the one slot is taken

	start := time.Now()
	_, out, err := b.guard.Do(ctx, r, nil2xx(t))
	require.Less(t, time.Since(start), 5*time.Second, "refused at once, not after its wait")
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.Equal(t, idem.OutcomeInProgress, out)
	require.EqualValues(t, 1, b.guard.Stats().WaitsRefused)
	require.Empty(t, subscribed, "the refused request never subscribed")
	close(g.open)
	wg.Wait()
	require.EqualValues(t, 1, b.guard.Stats().Waited)
}

// The running request says nothing happened (429): the waiter, woken by
// the release, runs the work itself.
func TestWaiterRunsAReleasedKey(t *testing.T) {
	subscribed := make(chan struct{}, 1)
	b := setup(t, "hybrid-miniredis", withWait, withSubscribeSignal(subscribed))
	ctx := context.Background()
	r := req("u", newKey(), "x")
	g := newGate(idem.Response{Status: http.StatusTooManyRequests})
	var wg sync.WaitGroup
	wg.Go(func() { _, _, _ = b.guard.Do(ctx, r, g.work) })
	<-g.started
	done := make(chan idem.Outcome, 1)
	w := &counter{resp: created("mine")}
	go func() {
		_, out, _ := b.guard.Do(ctx, r, w.work)
		done <- out
	}()
	<-subscribed // the retry waits for the running request
	close(g.open)
	wg.Wait()
	require.Equal(t, idem.OutcomeExecuted, <-done)
	require.EqualValues(t, 1, w.n.Load())
}

// A key waiting for reconciliation is not waited for: its answer is minutes
// away.
func TestNoWaitForPendingKeys(t *testing.T) {
	b := setup(t, "table", withWait)
	ctx := context.Background()
	r := req("u", newKey(), "x")
	_, out, _ := b.guard.Do(ctx, r, (&counter{resp: idem.Response{Status: 504}}).work)
	require.Equal(t, idem.OutcomeExecutedUnstored, out)
	_, err := b.pool.Exec(ctx, "UPDATE "+b.store.Table()+" SET created_at = now() - interval '2 minutes', hold_until = now() - interval '1 minute' WHERE key = $1", r.Key)
	require.NoError(t, err)
	start := time.Now()
	_, out, err = b.guard.Do(ctx, r, nil2xx(t))
	require.Less(t, time.Since(start), 5*time.Second)
	require.ErrorIs(t, err, idem.ErrPending)
	require.Equal(t, idem.OutcomeInProgress, out)
	require.Zero(t, b.guard.Stats().WaitTimeouts+b.guard.Stats().Waited)
}

// Over HTTP: the Guard's Config.Wait turns the 409 into the replayed answer.
func TestMiddlewareWait(t *testing.T) {
	started, open := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := &orderHandler{}
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(started); <-open })
		h.ServeHTTP(w, r)
	})
	subscribed := make(chan struct{}, 1)
	b := setup(t, "table", withWait, withSubscribeSignal(subscribed))
	srv := httptest.NewServer(b.guard.Middleware(bearerScope, nil)(slow))
	t.Cleanup(srv.Close)
	k := newKey()
	post := func(out chan<- *http.Response) {
		r, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader("a"))
		r.Header.Set("Authorization", "Bearer u")
		r.Header.Set(idem.HeaderKey, k)
		resp, err := srv.Client().Do(r)
		if err != nil {
			out <- nil
			return
		}
		out <- resp
	}
	firstDone, retryDone := make(chan *http.Response, 1), make(chan *http.Response, 1)
	go post(firstDone)
	<-started
	go post(retryDone)
	<-subscribed // the retry waits for the running request
	close(open)
	first, retry := <-firstDone, <-retryDone
	require.NotNil(t, first)
	require.NotNil(t, retry)
	defer first.Body.Close()
	defer retry.Body.Close()
	fb, _ := io.ReadAll(first.Body)
	rb, _ := io.ReadAll(retry.Body)
	require.Equal(t, http.StatusCreated, first.StatusCode)
	require.Equal(t, http.StatusCreated, retry.StatusCode)
	require.Equal(t, "true", retry.Header.Get(idem.HeaderReplayed))
	require.Equal(t, fb, rb)
	require.EqualValues(t, 1, h.calls.Load())
}

// Config.Wait without a Waiter is a misconfiguration: no request could wait,
// every retry would get 409 at once; a wait as long as MaxHold could only
// end on a key pending reconciliation, which is never waited for. New
// refuses both, naming the field.
func TestWaitNeedsAWaiter(t *testing.T) {
	b := setup(t, "table")
	_, err := idem.New(b.store, &idem.Config{Wait: 5 * time.Second})
	require.EqualError(t, err, "idem: Config.Wait 5s needs a Config.Waiter: without one no request waits, and every retry of a running key is refused at once")
	_, err = idem.New(b.store, &idem.Config{Wait: -time.Second})
	require.EqualError(t, err, "idem: Config.Wait must not be negative, got -1s")

	w := setup(t, "table", withWait)
	_, err = idem.New(w.store, &idem.Config{Waiter: noWaiter{}, Wait: w.guard.MaxHold()})
	require.ErrorContains(t, err, "idem: Config.Wait 46.5s must be shorter than the Guard's MaxHold 46.5s")
	_, err = idem.New(w.store, &idem.Config{Waiter: noWaiter{}, Wait: 5 * time.Second})
	require.NoError(t, err)
}

// noWaiter is a Waiter that never wakes anyone.
type noWaiter struct{}

func (noWaiter) Subscribe(string, string) (<-chan struct{}, func()) { return nil, func() {} }
