package reconcile_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/internal/clock"
	"github.com/idemguard/idem/reconcile"
)

// The database's clock steps forward 3 minutes while a request runs (a VM
// resumed, an NTP correction): every statement then sees the row as 3
// minutes old and past its hold_until, which b.age reproduces. The
// reconciler still leaves the running key alone, because it counts the
// row's hold and MinAge on its own monotonic clock from when it first listed
// that owner there; the work answers, once. A key abandoned the same way is
// released only once that much has passed on the reconciler's clock, and a
// new leader, which has not seen the key, counts afresh (issue 26, item 1).
func TestReconcilerCountsOnItsOwnClock(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, b *bundle) {
		var own clock.Offset
		ctx := clock.With(t.Context(), own.Now) // no head start: the reconciler's own clock
		b.res.answer(reconcile.Decision{Verdict: reconcile.NothingHappened}, nil)
		r := b.reconciler(t, nil)
		run := func(r *reconcile.Reconciler) reconcile.Result {
			t.Helper()
			res, err := r.RunOnce(ctx)
			require.NoError(t, err)
			return res
		}

		// A running execution, its row stepped 3 minutes into the past.
		live := request(newKey())
		started, open := make(chan struct{}), make(chan struct{})
		done := make(chan idem.Outcome, 1)
		w := &work{resp: idem.Response{Status: http.StatusCreated, Body: []byte("live")}}
		go func() {
			_, out, _ := b.guard.Do(b.ctx, live, func(ctx context.Context) (idem.Response, error) {
				close(started)
				<-open
				return w.do(ctx)
			})
			done <- out
		}()
		<-started
		b.age(t, live.Scope, live.Key, "3 minutes")

		// An abandoned key (its execution ended in a 504), stepped the same.
		gone := request(newKey())
		b.timedOut(t, gone)
		b.age(t, gone.Scope, gone.Key, "3 minutes")

		require.Equal(t, reconcile.Result{}, run(r), "both listed, neither due on the reconciler's clock")
		require.Empty(t, b.res.calls(), "nothing resolved")
		own.Advance(b.guard.MaxHold() / 2)
		require.Equal(t, reconcile.Result{}, run(r))
		require.Empty(t, b.res.calls())

		close(open)
		require.Equal(t, idem.OutcomeExecuted, <-done, "the running execution stored its answer")
		require.EqualValues(t, 1, w.n.Load())

		// MinAge (1m, longer than the Guard's MaxHold) since the first
		// listing: the abandoned key is due, on this reconciler only.
		own.Advance(time.Minute)
		leader := b.reconciler(t, nil)
		require.Equal(t, reconcile.Result{}, run(leader), "a new leader counts afresh")
		require.Equal(t, reconcile.Result{Released: 1}, run(r))
		items := b.res.calls()
		require.Len(t, items, 1)
		require.Equal(t, gone.Key, items[0].Key)

		resp, out, err := b.guard.Do(b.ctx, live, w.do)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeReplayed, out)
		require.Equal(t, "live", string(resp.Body))
		require.EqualValues(t, 1, w.n.Load(), "the live key ran once")
	})
}
