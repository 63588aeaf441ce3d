package durable_test

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/testdb"
)

// rowsBundle is a store of its own schema, on which the reconciler's
// statements run.
type rowsBundle struct {
	ctx   context.Context
	store *durable.Store
	pool  *pgxpool.Pool
}

func setupRows(t *testing.T) *rowsBundle {
	store, pool := testdb.Store(t, nil)
	return &rowsBundle{ctx: t.Context(), store: store, pool: pool}
}

// stateTable is the reconciler's table (<table>_reconcile), beside the
// store's.
func stateTable(t string) string { return t[:len(t)-1] + `_reconcile"` }

func (b *rowsBundle) claim(t *testing.T, key string) idem.Token {
	t.Helper()
	var owner idem.Token
	_, _ = rand.Read(owner[:])
	_, ok, err := b.store.Claim(b.ctx, idem.ClaimParams{Scope: "user-1", Key: key, Fingerprint: idem.Fingerprint{1}, Owner: owner})
	require.NoError(t, err)
	require.True(t, ok)
	return owner
}

// age moves a row's created_at back by, as if it had been claimed that long
// ago. The mark of the reconciler's scan, if any, moves before it: no scan
// could have passed a row before it was due.
func (b *rowsBundle) age(t *testing.T, key, by string) {
	t.Helper()
	var created time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `UPDATE `+b.store.Table()+` SET created_at = created_at - $2::interval,
	hold_until = hold_until - $2::interval
WHERE user_id = 'user-1' AND key = $1 RETURNING created_at`, key, by).Scan(&created))
	_, err := b.pool.Exec(b.ctx, `UPDATE `+stateTable(b.store.Table())+` SET scanned_to = least(scanned_to, $1::timestamptz - interval '1 microsecond')`, created)
	require.NoError(t, err)
}

func (b *rowsBundle) state(t *testing.T, key string) (attempts int, after *time.Time, inFuture bool) {
	t.Helper()
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT reconcile_attempts, reconcile_after, coalesce(reconcile_after > now(), false)
FROM `+b.store.Table()+` WHERE user_id = 'user-1' AND key = $1`, key).Scan(&attempts, &after, &inFuture))
	return attempts, after, inFuture
}

func keysOf(ds []durable.Due) []string {
	var keys []string
	for _, d := range ds {
		keys = append(keys, d.Key)
	}
	return keys
}

// listNew lists the new rows of the window of minAge (overlap 1m), limit at
// a time, and returns all of them and the end of the window.
func (b *rowsBundle) listNew(t *testing.T, minAge time.Duration, limit int) ([]durable.Due, time.Time) {
	t.Helper()
	from, to, err := b.store.ScanWindow(b.ctx, minAge, time.Minute)
	require.NoError(t, err)
	var all []durable.Due
	for pos := (durable.Due{CreatedAt: from}); ; {
		ds, err := b.store.ListNew(b.ctx, pos, to, limit)
		require.NoError(t, err)
		all = append(all, ds...)
		if len(ds) < limit {
			return all, to
		}
		pos = ds[len(ds)-1]
	}
}

func (b *rowsBundle) listPostponed(t *testing.T) []string {
	t.Helper()
	ds, err := b.store.ListPostponed(b.ctx, 10)
	require.NoError(t, err)
	return keysOf(ds)
}

// New rows: in progress (not answered, not released), never postponed, older
// than the age, within the window; oldest first, page by page.
func TestBacklogNew(t *testing.T) {
	b := setupRows(t)
	owners := map[string]idem.Token{}
	for key, age := range map[string]string{"k10": "10 minutes", "k30": "30 minutes", "k20": "20 minutes"} {
		owners[key] = b.claim(t, key)
		b.age(t, key, age)
	}
	b.claim(t, "fresh")
	done := b.claim(t, "done")
	require.NoError(t, b.store.Complete(b.ctx, "user-1", "done", done, idem.Response{Status: 200}))
	b.age(t, "done", "40 minutes")
	released := b.claim(t, "released")
	require.NoError(t, b.store.Release(b.ctx, "user-1", "released", released))
	b.age(t, "released", "25 minutes")
	p := durable.Due{Scope: "user-1", Key: "postponed", Owner: b.claim(t, "postponed")}
	b.age(t, "postponed", "15 minutes")
	require.NoError(t, b.store.Postpone(b.ctx, p, 1, 0))

	for _, limit := range []int{1, 2, 10} {
		ds, _ := b.listNew(t, 5*time.Minute, limit)
		require.Equal(t, []string{"k30", "k20", "k10"}, keysOf(ds), "limit %d", limit)
		for _, d := range ds {
			require.Zero(t, d.Attempts)
			require.Equal(t, owners[d.Key], d.Owner)
			require.Equal(t, idem.Fingerprint{1}, d.Fingerprint)
		}
	}
	ds, _ := b.listNew(t, 0, 10)
	require.Equal(t, []string{"k30", "k20", "k10", "fresh"}, keysOf(ds))

	// Keys created at the same microsecond are ordered by scope and key,
	// and the cursor passes each once.
	_, err := b.pool.Exec(b.ctx, `UPDATE `+b.store.Table()+` SET created_at = (SELECT created_at FROM `+b.store.Table()+` WHERE key = 'k20') WHERE key = 'k10'`)
	require.NoError(t, err)
	ds, _ = b.listNew(t, 5*time.Minute, 1)
	require.Equal(t, []string{"k30", "k10", "k20"}, keysOf(ds))
}

// The window starts at the oldest row until a scan is marked (a row in
// progress never expires, however old), then at the mark less the overlap;
// it ends at now - min age.
func TestBacklogWindow(t *testing.T) {
	b := setupRows(t)
	from, to, err := b.store.ScanWindow(b.ctx, time.Minute, 30*time.Second)
	require.NoError(t, err)
	var now time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, "SELECT now()").Scan(&now))
	require.WithinDuration(t, now.Add(-time.Minute), from, 5*time.Second, "an empty table: an empty window")
	require.WithinDuration(t, now.Add(-time.Minute), to, 5*time.Second)

	b.claim(t, "ancient")
	b.age(t, "ancient", "72 hours")
	from, _, err = b.store.ScanWindow(b.ctx, time.Minute, 30*time.Second)
	require.NoError(t, err)
	require.WithinDuration(t, now.Add(-72*time.Hour), from, 5*time.Second, "the first scan starts at the oldest row")
	ds, _ := b.listNew(t, time.Minute, 10)
	require.Equal(t, []string{"ancient"}, keysOf(ds), "a key in progress for longer than the retention is listed")
	_, err = b.pool.Exec(b.ctx, `DELETE FROM `+b.store.Table())
	require.NoError(t, err)

	mark := now.Add(-10 * time.Minute).Truncate(time.Microsecond)
	require.NoError(t, b.store.MarkScanned(b.ctx, mark))
	from, _, err = b.store.ScanWindow(b.ctx, time.Minute, 30*time.Second)
	require.NoError(t, err)
	require.True(t, from.Equal(mark.Add(-30*time.Second)), "from %v, mark %v", from, mark)

	// A row created before the window is not listed again.
	b.claim(t, "old")
	b.age(t, "old", "20 minutes")
	require.NoError(t, b.store.MarkScanned(b.ctx, now.Add(-2*time.Minute)))
	ds, _ = b.listNew(t, time.Minute, 10)
	require.Empty(t, ds)

	// A mark past a whole retention starts at the mark: a row in progress
	// never expires, so a reconciler that was stopped for longer still
	// lists the rows claimed meanwhile.
	mark = now.Add(-48 * time.Hour).Truncate(time.Microsecond)
	require.NoError(t, b.store.MarkScanned(b.ctx, mark))
	from, _, err = b.store.ScanWindow(b.ctx, time.Minute, 30*time.Second)
	require.NoError(t, err)
	require.True(t, from.Equal(mark.Add(-30*time.Second)), "from %v, mark %v", from, mark)
}

// Postponed rows: listed once their time has come on the database clock,
// while in progress (however old), in the order it came; never as new rows.
func TestBacklogPostponed(t *testing.T) {
	b := setupRows(t)
	var ds []durable.Due
	for _, key := range []string{"a", "b", "c", "d"} {
		ds = append(ds, durable.Due{Scope: "user-1", Key: key, Owner: b.claim(t, key)})
		b.age(t, key, "10 minutes")
	}
	require.NoError(t, b.store.Postpone(b.ctx, ds[0], 3, time.Hour))
	require.NoError(t, b.store.Postpone(b.ctx, ds[1], 1, 0))
	require.NoError(t, b.store.Postpone(b.ctx, ds[2], 1, 0))
	attempts, after, inFuture := b.state(t, "a")
	require.Equal(t, 3, attempts)
	require.NotNil(t, after)
	require.True(t, inFuture)

	require.Equal(t, []string{"b", "c"}, b.listPostponed(t))
	nw, _ := b.listNew(t, time.Minute, 10)
	require.Equal(t, []string{"d"}, keysOf(nw), "postponed rows are not new")

	_, err := b.pool.Exec(b.ctx, `UPDATE `+b.store.Table()+` SET reconcile_after = now() - interval '1 hour' WHERE key = 'a'`)
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b", "c"}, b.listPostponed(t))

	// Answered: out of the list and of the partial index.
	require.NoError(t, b.store.Complete(b.ctx, "user-1", "a", ds[0].Owner, idem.Response{Status: 201}))
	_, after, _ = b.state(t, "a")
	require.Nil(t, after)
	// Released: out of the list. Old: still in it.
	require.NoError(t, b.store.Release(b.ctx, "user-1", "b", ds[1].Owner))
	b.age(t, "c", "25 hours")
	require.Equal(t, []string{"c"}, b.listPostponed(t))
}

// Postpone acts on the listed claim only: another owner, a finished, missing
// or released row is refused, each with its error; an old one is not.
func TestBacklogPostpone(t *testing.T) {
	b := setupRows(t)
	owner := b.claim(t, "key-1")
	d := durable.Due{Scope: "user-1", Key: "key-1", Owner: owner}
	require.NoError(t, b.store.Postpone(b.ctx, d, 1, 0))
	attempts, after, inFuture := b.state(t, "key-1")
	require.Equal(t, 1, attempts)
	require.NotNil(t, after)
	require.False(t, inFuture, "a zero delay is due at once")

	other := d
	other.Owner = idem.Token{9}
	require.ErrorIs(t, b.store.Postpone(b.ctx, other, 2, time.Minute), idem.ErrNotOwner)
	missing := d
	missing.Key = "nope"
	require.ErrorIs(t, b.store.Postpone(b.ctx, missing, 2, time.Minute), idem.ErrNotFound)
	require.NoError(t, b.store.Complete(b.ctx, "user-1", "key-1", owner, idem.Response{Status: 201}))
	require.ErrorIs(t, b.store.Postpone(b.ctx, d, 2, time.Minute), idem.ErrCompleted)

	q := durable.Due{Scope: "user-1", Key: "key-2", Owner: b.claim(t, "key-2")}
	b.age(t, "key-2", "25 hours")
	require.NoError(t, b.store.Postpone(b.ctx, q, 1, time.Minute), "a row in progress never expires")
	require.NoError(t, b.store.Release(b.ctx, "user-1", "key-2", q.Owner))
	require.ErrorIs(t, b.store.Postpone(b.ctx, q, 2, time.Minute), idem.ErrNotFound, "a released row")
}

// The next attempt that takes over a released row does not inherit the
// backoff of the old one.
func TestTakeoverResetsReconcileState(t *testing.T) {
	b := setupRows(t)
	old := durable.Due{Scope: "user-1", Key: "key-1", Owner: b.claim(t, "key-1")}
	require.NoError(t, b.store.Postpone(b.ctx, old, 7, 48*time.Hour))
	require.NoError(t, b.store.Release(b.ctx, "user-1", "key-1", old.Owner))

	next := b.claim(t, "key-1")
	attempts, after, _ := b.state(t, "key-1")
	require.Zero(t, attempts)
	require.Nil(t, after)

	b.age(t, "key-1", "2 minutes")
	ds, _ := b.listNew(t, time.Minute, 10)
	require.Equal(t, []string{"key-1"}, keysOf(ds))
	require.Equal(t, next, ds[0].Owner)
	require.Empty(t, b.listPostponed(t))
}
