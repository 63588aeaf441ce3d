package idem_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/internal/testredis"
	"github.com/idemguard/idem/lock"
)

// A clean shutdown loses no copy: answers whose copies wait behind an
// exchange in flight when Shutdown is called are all in Redis once it
// returns, and the requests that come after it claim without a lease.
func TestShutdownSendsQueuedCopies(t *testing.T) {
	forEachHybrid(t, func(t *testing.T, strategy string) {
		r := newLeaseRig(t, strategy, nil, nil)
		// The Guard under test has a client of its own, closed as soon as
		// Shutdown returns, as a service closes its client on the way out.
		var gc *redis.Client
		if r.mr != nil {
			gc = testredis.Miniredis(t, r.mr)
		} else {
			gc = testredis.Client(t)
		}
		gate := newCopyGate()
		gc.AddHook(gate)
		l, err := lock.New(gc, &lock.Config{Prefix: r.prefix, Timeout: 5 * time.Second})
		require.NoError(t, err)
		called := make(chan struct{})
		g, err := idem.New(r.count, &idem.Config{Lock: shutdownSignal{l, called, new(sync.Once)}, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)

		// n executions run while nothing is held; their copies are queued
		// once the first copy of another key is held in flight.
		const n = 8
		rqs := make([]idem.Request, n)
		started, finish := make(chan struct{}, n), make(chan struct{})
		var wg sync.WaitGroup
		for i := range rqs {
			rqs[i] = req("user-1", newKey(), `{"sku":1}`)
			wg.Go(func() {
				_, out, err := g.Do(t.Context(), rqs[i], func(context.Context) (idem.Response, error) {
					started <- struct{}{}
					<-finish
					return created("o-s"), nil
				})
				if err != nil || out != idem.OutcomeExecuted {
					t.Errorf("request %d: %v %v", i, out, err)
				}
			})
		}
		for range n {
			<-started
		}
		first := req("user-1", newKey(), `{"sku":1}`)
		var c counter
		c.resp = created("o-first")
		_, out, err := g.Do(t.Context(), first, c.work)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out)
		<-gate.held // the first copy is in flight
		close(finish)
		wg.Wait() // every answer is stored and its copy queued behind the first

		done := make(chan error, 1)
		go func() { done <- g.Shutdown(context.Background()) }()
		<-called // the Guard has stopped using the lease
		after := req("user-1", newKey(), `{"sku":1}`)
		var late counter
		late.resp = created("o-late")
		_, out, err = g.Do(t.Context(), after, late.work)
		require.NoError(t, err, "claimed without the lease, not queued behind the copies")
		require.Equal(t, idem.OutcomeExecuted, out)
		select {
		case err := <-done:
			t.Fatalf("Shutdown returned (%v) while the copies wait behind an exchange in flight", err)
		default:
		}
		close(gate.release)
		require.NoError(t, <-done)
		require.NoError(t, gc.Close())
		require.NoError(t, g.Shutdown(t.Context()), "a second Shutdown")

		// Every copy is in Redis: another instance replays each without
		// PostgreSQL. The request after Shutdown left no lease.
		count := &countingStore{Store: r.store}
		b, err := idem.New(count, &idem.Config{Lock: r.locker, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		for i, rq := range append(rqs, first) {
			resp, out, err := b.Do(t.Context(), rq, mustNotRun(t))
			require.NoError(t, err, i)
			require.Equal(t, idem.OutcomeReplayed, out, i)
			require.Equal(t, r.rowAnswer(t, rq), resp, i)
		}
		require.Zero(t, count.calls.Load(), "every replay came from its copy")
		left, err := r.redis.Exists(t.Context(), r.locker.Key(after.Scope, after.Key)).Result()
		require.NoError(t, err)
		require.Zero(t, left, "the request after Shutdown took no lease")
		require.EqualValues(t, 1, late.n.Load())
	})
}

// A Shutdown whose context ends before the queued copies are answered
// returns an error wrapping the context's; the copies still go once the
// exchange before them returns.
func TestShutdownEndsWithItsContext(t *testing.T) {
	forEachHybrid(t, func(t *testing.T, strategy string) {
		r := newLeaseRig(t, strategy, nil, nil)
		gate := newCopyGate()
		r.redis.AddHook(gate)
		rq := req("user-1", newKey(), `{"sku":1}`)
		var c counter
		c.resp = created("o-ctx")
		_, out, err := r.guard.Do(t.Context(), rq, c.work)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out)
		<-gate.held

		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- r.guard.Shutdown(ctx) }()
		cancel()
		err = <-done
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorContains(t, err, "idem: lock: shutdown: ")
		close(gate.release)
		require.NoError(t, r.guard.Shutdown(t.Context()), "a second Shutdown waits for the copy")
		v, err := r.redis.Exists(t.Context(), r.locker.Key(rq.Scope, rq.Key)).Result()
		require.NoError(t, err)
		require.EqualValues(t, 1, v)
	})
}

// shutdownSignal is a Locker that says when its Shutdown is called.
type shutdownSignal struct {
	*lock.Locker
	called chan struct{}
	once   *sync.Once
}

func (s shutdownSignal) Shutdown(ctx context.Context) error {
	s.once.Do(func() { close(s.called) })
	return s.Locker.Shutdown(ctx)
}
