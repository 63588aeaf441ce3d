package reconcile_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/reconcile"
)

// stateTable is the reconciler's table (<table>_reconcile), beside the store's.
func (b *bundle) stateTable() string {
	t := b.store.Table()
	return t[:len(t)-1] + `_reconcile"`
}

// scannedTo reads the mark of the last scan, and the database's now().
func (b *bundle) scannedTo(t *testing.T) (mark, now time.Time) {
	t.Helper()
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT scanned_to, now() FROM `+b.stateTable()).Scan(&mark, &now))
	return mark, now
}

// A run marks how far it scanned, now - MinAge; the next run, on any
// instance, starts there, so a key looked at once is not listed again by a
// restarted reconciler, even when nothing changed it meanwhile.
func TestRunMarksItsScan(t *testing.T) {
	t.Parallel()
	b := setup(t, "table")
	req := request(newKey())
	b.timedOut(t, req)
	b.age(t, req.Scope, req.Key, "2 minutes")
	b.res.answer(reconcile.Decision{Verdict: reconcile.Settled, Response: created("o1")}, nil)
	require.Equal(t, reconcile.Result{Settled: 1}, b.runOnce(t, b.reconciler(t, nil)))
	mark, now := b.scannedTo(t)
	require.WithinDuration(t, now.Add(-reconcile.DefaultMinAge), mark, 5*time.Second)

	// An in-progress row behind the mark by more than the overlap (MinAge):
	// a fresh Reconciler does not see it. (A real claim cannot commit that
	// late: see the package doc.)
	hidden := request(newKey())
	b.timedOut(t, hidden)
	_, err := b.pool.Exec(b.ctx, `UPDATE `+b.store.Table()+` SET created_at = $1::timestamptz - interval '90 seconds', hold_until = now() WHERE key = $2`, mark, hidden.Key)
	require.NoError(t, err)
	require.Equal(t, reconcile.Result{}, b.runOnce(t, b.reconciler(t, nil)))
	require.Empty(t, b.res.calls()[1:], "only the first run's key was resolved")
}

// A claim whose commit reached the table after the mark passed its
// created_at, by less than the overlap (MinAge), is still listed.
func TestRunRescansTheOverlap(t *testing.T) {
	t.Parallel()
	b := setup(t, "table")
	require.Equal(t, reconcile.Result{}, b.runOnce(t, b.reconciler(t, nil)))
	mark, _ := b.scannedTo(t)

	late := request(newKey())
	b.timedOut(t, late)
	_, err := b.pool.Exec(b.ctx, `UPDATE `+b.store.Table()+` SET created_at = $1::timestamptz - interval '30 seconds', hold_until = now() WHERE key = $2`, mark, late.Key)
	require.NoError(t, err)
	require.Equal(t, reconcile.Result{Unknown: 1}, b.runOnce(t, b.reconciler(t, nil)))
	items := b.res.calls()
	require.Len(t, items, 1)
	require.Equal(t, late.Key, items[0].Key)
}

// A key that could be neither decided nor postponed (the store refused
// both) holds the mark just before it, so the next run lists it again
// although nothing postponed it; the keys after it are not resolved twice.
func TestStuckKeyHoldsTheMark(t *testing.T) {
	t.Parallel()
	b := setup(t, "table")
	stuck, after := request(newKey()), request(newKey())
	b.timedOut(t, stuck)
	b.age(t, stuck.Scope, stuck.Key, "3 minutes")
	b.timedOut(t, after)
	b.age(t, after.Scope, after.Key, "2 minutes")
	// Every write of the reconciler's columns on the stuck key fails.
	schema := strings.Split(b.store.Table(), ".")[0]
	_, err := b.pool.Exec(b.ctx, `
CREATE FUNCTION `+schema+`.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.key = '`+stuck.Key+`' THEN RAISE EXCEPTION 'injected'; END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER refuse BEFORE UPDATE OF reconcile_after ON `+b.store.Table()+`
	FOR EACH ROW EXECUTE FUNCTION `+schema+`.refuse()`)
	require.NoError(t, err)

	r := b.reconciler(t, nil)
	require.Equal(t, reconcile.Result{Unknown: 1, Errors: 1}, b.runOnce(t, r))
	require.Len(t, b.res.calls(), 2)
	mark, _ := b.scannedTo(t)
	var created time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT created_at FROM `+b.store.Table()+` WHERE key = $1`, stuck.Key).Scan(&created))
	require.True(t, mark.Before(created), "mark %v, stuck key created %v", mark, created)

	_, err = b.pool.Exec(b.ctx, `DROP TRIGGER refuse ON `+b.store.Table())
	require.NoError(t, err)
	require.Equal(t, reconcile.Result{Unknown: 1}, b.runOnce(t, r))
	items := b.res.calls()
	require.Len(t, items, 1)
	require.Equal(t, stuck.Key, items[0].Key)
}
