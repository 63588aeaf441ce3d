package idem_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/idemtest"
)

// The Guard tells a running key from one whose execution has ended (pending
// reconciliation) by durations the store's statement returns, counted down
// on its own monotonic clock: a database clock minutes away from the host's,
// or one that stepped since the claim, neither makes a running key pending
// nor keeps an abandoned one running (issue 26, item 4).
func TestGuardCountsTheHoldOnItsOwnClock(t *testing.T) {
	for _, skew := range []time.Duration{-2 * time.Minute, 2 * time.Minute, -time.Hour} {
		t.Run("store clock "+skew.String(), func(t *testing.T) {
			var offset atomic.Int64
			offset.Store(int64(skew))
			store := idemtest.NewMemStore(&idemtest.MemStoreConfig{
				Now: func() time.Time { return time.Now().Add(time.Duration(offset.Load())) },
			})
			g, err := idem.New(store, nil)
			require.NoError(t, err)
			ctx := context.Background()
			r := req("u", newKey(), "x")

			started, open := make(chan struct{}), make(chan struct{})
			done := make(chan idem.Outcome)
			go func() {
				_, out, _ := g.Do(ctx, r, func(context.Context) (idem.Response, error) {
					close(started)
					<-open
					return created("1"), nil
				})
				done <- out
			}()
			<-started
			_, out, err := g.Do(ctx, r, mustNotRun(t))
			require.Equal(t, idem.OutcomeInProgress, out)
			require.ErrorIs(t, err, idem.ErrInProgress)
			require.NotErrorIs(t, err, idem.ErrPending, "running, whatever the store's clock says the time is")
			close(open)
			require.Equal(t, idem.OutcomeExecuted, <-done)

			// A key whose execution ended without an answer, past its hold
			// on the store's clock, is pending however far that clock is
			// from the host's.
			r = req("u", newKey(), "x")
			_, out, _ = g.Do(ctx, r, func(context.Context) (idem.Response, error) {
				return idem.Response{Status: 504}, nil
			})
			require.Equal(t, idem.OutcomeExecutedUnstored, out)
			require.True(t, store.Age(r.Scope, r.Key, g.MaxHold()+time.Second))
			_, out, err = g.Do(ctx, r, mustNotRun(t))
			require.Equal(t, idem.OutcomeInProgress, out)
			require.ErrorIs(t, err, idem.ErrPending)
		})
	}
}
