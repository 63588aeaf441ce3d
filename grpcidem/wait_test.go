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
// a Listener (PostgreSQL LISTEN/NOTIFY) that signals on subscribed, that
// lets a retry wait up to wait for a running call's answer (0: no waiting).
func waitingGuard(t *testing.T, subscribed chan<- struct{}, wait time.Duration) *idem.Guard {
	t.Helper()
	db := newTestDBWith(t, durable.Config{Notify: true})
	l, err := durable.NewListener(t.Context(), db.store)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return newGuard(t, db, &idem.Config{Waiter: signalWaiter{l, subscribed}, Wait: wait})
}

// With the Guard's Wait, a retry that arrives while the first call runs
// waits for its answer and gets it, replayed, instead of Aborted; the
// handler runs once.
func TestWaitGetsTheRunningAnswer(t *testing.T) {
	subscribed := make(chan struct{}, 1)
	g := waitingGuard(t, subscribed, 10*time.Second)
	started, unblock := make(chan struct{}), make(chan struct{})
	var runs atomic.Int64
	h := func(ctx context.Context, _ string, _ proto.Message) (proto.Message, error) {
		if runs.Add(1) == 1 {
			close(started)
			<-unblock
		}
		return structpb.NewStruct(map[string]any{"charge": "ch_1"})
	}
	conn := serve(t, grpcidem.UnaryServerInterceptor(g, scopeFromMetadata, nil), h)
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

// A Guard with a Waiter but no Wait refuses the retry at once.
func TestNoWaitWithoutWait(t *testing.T) {
	subscribed := make(chan struct{}, 1)
	g := waitingGuard(t, subscribed, 0)
	started, unblock := make(chan struct{}), make(chan struct{})
	h := func(ctx context.Context, _ string, _ proto.Message) (proto.Message, error) {
		close(started)
		<-unblock
		return structpb.NewStruct(map[string]any{"charge": "ch_1"})
	}
	conn := serve(t, grpcidem.UnaryServerInterceptor(g, scopeFromMetadata, nil), h)
	key := newKey()
	first := make(chan result, 1)
	go func() { first <- charge(t, conn, "user-1", key, order(t, 42)) }()
	<-started
	requireRefusal(t, charge(t, conn, "user-1", key, order(t, 42)).err, codes.Aborted, grpcidem.ReasonInProgress)
	require.Empty(t, subscribed, "nobody waited")
	close(unblock)
	require.NoError(t, (<-first).err)
}
