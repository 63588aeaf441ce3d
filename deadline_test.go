package idem_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
)

// ctxSeen is what a store saw of one call's context.
type ctxSeen struct {
	at       time.Time
	deadline time.Time
	err      error
}

// deadlineSpy records the context of each Claim and Complete.
type deadlineSpy struct {
	idem.Store
	mu        sync.Mutex
	claims    []ctxSeen
	completes []ctxSeen
}

func seen(ctx context.Context) ctxSeen {
	dl, _ := ctx.Deadline()
	return ctxSeen{at: time.Now(), deadline: dl, err: ctx.Err()}
}

func (s *deadlineSpy) Claim(ctx context.Context, p idem.ClaimParams) (idem.Record, bool, error) {
	c := seen(ctx)
	s.mu.Lock()
	s.claims = append(s.claims, c)
	s.mu.Unlock()
	return s.Store.Claim(ctx, p)
}

func (s *deadlineSpy) Complete(ctx context.Context, scope, key string, owner idem.Token, a idem.Response) error {
	c := seen(ctx)
	s.mu.Lock()
	s.completes = append(s.completes, c)
	s.mu.Unlock()
	return s.Store.Complete(ctx, scope, key, owner, a)
}

// Each bound is its own: the claim gets StoreTimeout, the work WorkTimeout
// from the claim on, and the answer's write a fresh StoreTimeout even when
// the work used its whole budget and the caller hung up meanwhile.
func TestCallDeadlines(t *testing.T) {
	const (
		storeTimeout = 2 * time.Second
		workTimeout  = 300 * time.Millisecond
		slack        = 250 * time.Millisecond // a loaded machine's scheduling delay
	)
	forEachStrategy(t, func(t *testing.T, strategy string) {
		spy := &deadlineSpy{}
		b := setup(t, strategy, func(o *setupOpts) {
			o.cfg.StoreTimeout, o.cfg.WorkTimeout = storeTimeout, workTimeout
			o.store = func(s idem.Store) idem.Store { spy.Store = s; return spy }
		})
		ctx, hangUp := context.WithCancel(context.Background())
		defer hangUp()
		var work ctxSeen
		var workErr error
		_, out, err := b.guard.Do(ctx, req("u", newKey(), "x"), func(wctx context.Context) (idem.Response, error) {
			work = seen(wctx)
			<-wctx.Done() // the whole budget
			workErr = wctx.Err()
			hangUp()
			return created("late"), nil
		})
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out)

		require.Len(t, spy.claims, 1)
		claim := spy.claims[0]
		require.NoError(t, claim.err)
		require.InDelta(t, float64(storeTimeout), float64(claim.deadline.Sub(claim.at)), float64(slack), "the claim gets StoreTimeout")

		require.NoError(t, work.err)
		require.InDelta(t, float64(workTimeout), float64(work.deadline.Sub(work.at)), float64(slack), "the work gets WorkTimeout")
		require.ErrorIs(t, workErr, context.DeadlineExceeded)

		require.Len(t, spy.completes, 1)
		write := spy.completes[0]
		require.NoError(t, write.err, "the write is not cut short by the work's deadline or the caller hanging up")
		require.True(t, write.at.After(work.deadline))
		require.InDelta(t, float64(storeTimeout), float64(write.deadline.Sub(write.at)), float64(slack), "the write gets StoreTimeout of its own")
	})
}

// A caller's deadline earlier than StoreTimeout bounds the claim, as
// context.WithDeadline would; the work runs to its own WorkTimeout from the
// claim, which the caller's deadline does not shorten (a charge under way
// is not cut off), and the answer's write has a StoreTimeout of its own.
func TestCallerDeadlineFirst(t *testing.T) {
	spy := &deadlineSpy{}
	b := setup(t, "table", func(o *setupOpts) {
		o.store = func(s idem.Store) idem.Store { spy.Store = s; return spy }
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	caller, _ := ctx.Deadline()
	var work time.Time
	_, out, err := b.guard.Do(ctx, req("u", newKey(), "x"), func(wctx context.Context) (idem.Response, error) {
		work, _ = wctx.Deadline()
		return created("x"), nil
	})
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out)
	require.Equal(t, caller, spy.claims[0].deadline)
	require.InDelta(t, float64(20*time.Second), float64(work.Sub(spy.claims[0].at)), float64(250*time.Millisecond),
		"the work's deadline is WorkTimeout from the claim, not the caller's")
	require.InDelta(t, float64(5*time.Second), float64(spy.completes[0].deadline.Sub(spy.completes[0].at)), float64(250*time.Millisecond),
		"the write is detached from the caller: StoreTimeout")
}
