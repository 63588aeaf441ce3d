package grpcidem_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/grpcidem"
)

// signalWaiter sends on subscribed each time a call subscribes, that is,
// starts to wait: the test opens its gate on that signal, not after a sleep
// that hopes the retry got there.
type signalWaiter struct {
	idem.Waiter
	subscribed chan<- struct{}
}

func (w signalWaiter) Subscribe(scope, key string) (<-chan struct{}, func()) {
	wake, cancel := w.Waiter.Subscribe(scope, key)
	w.subscribed <- struct{}{}
	return wake, cancel
}

// waitingGuard is a Guard over a store that announces its answers, woken by
// a Listener (PostgreSQL LISTEN/NOTIFY) that signals on subscribed.
func waitingGuard(t *testing.T, subscribed chan<- struct{}) *idem.Guard {
	t.Helper()
	db := newTestDBWith(t, durable.Config{Notify: true})
	l, err := durable.NewListener(t.Context(), db.store, db.pool)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return newGuard(t, db, &idem.Config{Waiter: signalWaiter{l, subscribed}})
}

// With WithWait, a retry that arrives while the first call runs waits for
// its answer and gets it, replayed, instead of Aborted; the handler runs once.
func TestWaitGetsTheRunningAnswer(t *testing.T) {
	subscribed := make(chan struct{}, 1)
	g := waitingGuard(t, subscribed)
	started, unblock := make(chan struct{}), make(chan struct{})
	var runs atomic.Int64
	h := func(ctx context.Context, _ string, _ proto.Message) (proto.Message, error) {
		if runs.Add(1) == 1 {
			close(started)
			<-unblock
		}
		return structpb.NewStruct(map[string]any{"charge": "ch_1"})
	}
	conn := serve(t, grpcidem.UnaryServerInterceptor(g, scopeFromMetadata, grpcidem.WithWait(10*time.Second)), h)
	key := newKey()

	first, retry := make(chan result, 1), make(chan result, 1)
	go func() { first <- charge(t, conn, "user-1", key, order(t, 42)) }()
	<-started
	go func() { retry <- charge(t, conn, "user-1", key, order(t, 42)) }()
	select {
	case r := <-retry:
		t.Fatalf("the retry did not wait: %v", r.err)
	case <-subscribed: // the retry waits for the running call
	}
	close(unblock)
	f, r := <-first, <-retry
	require.NoError(t, f.err)
	require.NoError(t, r.err)
	require.False(t, f.replayed)
	require.True(t, r.replayed, "the retry got the running call's answer")
	require.True(t, proto.Equal(f.resp, r.resp), "retry got %v, want %v", r.resp, f.resp)
	require.EqualValues(t, 1, runs.Load())
	require.EqualValues(t, 1, g.Stats().Waited)
}

// Without WithWait, the same Guard refuses the retry at once: waiting is the
// interceptor's choice, not the Guard's.
func TestNoWaitWithoutWithWait(t *testing.T) {
	subscribed := make(chan struct{}, 1)
	g := waitingGuard(t, subscribed)
	started, unblock := make(chan struct{}), make(chan struct{})
	h := func(ctx context.Context, _ string, _ proto.Message) (proto.Message, error) {
		close(started)
		<-unblock
		return structpb.NewStruct(map[string]any{"charge": "ch_1"})
	}
	conn := serve(t, grpcidem.UnaryServerInterceptor(g, scopeFromMetadata), h)
	key := newKey()
	first := make(chan result, 1)
	go func() { first <- charge(t, conn, "user-1", key, order(t, 42)) }()
	<-started
	requireRefusal(t, charge(t, conn, "user-1", key, order(t, 42)).err, codes.Aborted, grpcidem.ReasonInProgress)
	require.Empty(t, subscribed, "nobody waited")
	close(unblock)
	require.NoError(t, (<-first).err)
}

// Asking to wait on a Guard that has no Waiter is a misconfiguration: every
// retry would be refused at once. It fails when the interceptor is built.
func TestWithWaitNeedsAWaiter(t *testing.T) {
	g := newGuard(t, newTestDB(t), nil)
	require.PanicsWithError(t,
		"idem: waiting up to 5s (WaitFor, WithWait) needs a Guard with Config.Waiter: without one no request waits, and every retry of a running key is refused at once",
		func() { grpcidem.UnaryServerInterceptor(g, scopeFromMetadata, grpcidem.WithWait(5*time.Second)) })
	require.NotPanics(t, func() { grpcidem.UnaryServerInterceptor(g, scopeFromMetadata, grpcidem.WithWait(0)) })
}
