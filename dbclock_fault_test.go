package idem_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/tempserver"
	"github.com/idemguard/idem/reconcile"
)

// The database host's clock steps forward 3 minutes two seconds into a
// running execution (a throwaway cluster under libfaketime), then back 3
// minutes behind the host. The reconciler, with the defaults, lists the
// running key at once (by the database's clock it is 3 minutes old and past
// its hold_until) but leaves it alone: it counts the hold and MinAge on its
// own clock. The work's answer is stored and replayed, once. Before, one
// pass released the key and its retry charged a second time (issue 26,
// item 1, 5 of 5). With the clock 3 minutes behind, the answered key still
// replays and a new key runs.
func TestDatabaseClockSteps(t *testing.T) {
	p, step := tempserver.StartPostgresWithClock(t)
	pool := poolFor(t, p.URL(), nil)
	require.NoError(t, durable.Migrate(t.Context(), pool, nil))
	store, err := durable.New(pool, nil)
	require.NoError(t, err)
	g, err := idem.New(store, &idem.Config{Logger: quietLogger()})
	require.NoError(t, err)
	var resolved int
	rec, err := reconcile.New(g, store, func(context.Context, reconcile.Item) (reconcile.Decision, error) {
		resolved++
		return reconcile.Decision{Verdict: reconcile.NothingHappened}, nil // as a lookup finds no charge yet
	}, nil)
	require.NoError(t, err)

	r := req("u", newKey(), "pay")
	var runs int
	started, finish := make(chan struct{}), make(chan struct{})
	done := make(chan idem.Outcome, 1)
	work := func(context.Context) (idem.Response, error) {
		runs++
		close(started)
		<-finish
		return idem.Response{Status: http.StatusCreated, Body: []byte("paid")}, nil
	}
	go func() {
		_, out, _ := g.Do(context.Background(), r, work)
		done <- out
	}()
	<-started
	step(3 * time.Minute)
	var aged bool
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT created_at < now() - interval '2 minutes' FROM idempotency_keys WHERE key = $1", r.Key).Scan(&aged))
	require.True(t, aged, "the database's clock moved: the running key looks 3 minutes old")
	for range 2 {
		res, err := rec.RunOnce(t.Context())
		require.NoError(t, err)
		require.Equal(t, reconcile.Result{}, res, "the running execution is left alone")
	}
	require.Zero(t, resolved)
	_, out, err := g.Do(t.Context(), r, mustNotRun(t))
	require.Equal(t, idem.OutcomeInProgress, out, "refused, never run: %v", err)

	close(finish)
	require.Equal(t, idem.OutcomeExecuted, <-done)
	resp, out, err := g.Do(t.Context(), r, mustNotRun(t))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out)
	require.Equal(t, "paid", string(resp.Body))

	step(-3 * time.Minute)
	resp, out, err = g.Do(t.Context(), r, mustNotRun(t))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out, "the answered key replays with the clock behind")
	require.Equal(t, "paid", string(resp.Body))
	_, out, err = g.Do(t.Context(), req("u", newKey(), "pay"), func(context.Context) (idem.Response, error) {
		return idem.Response{Status: http.StatusCreated}, nil
	})
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out, "a new key runs")
	require.Equal(t, 1, runs, "one execution")
}
