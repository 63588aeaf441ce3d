package reconcile

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/testdb"
)

// rowsBundle is a store of its own schema and the reconciler's statements
// on it.
type rowsBundle struct {
	ctx   context.Context
	store *durable.Store
	pool  *pgxpool.Pool
	rows  rows
}

func setupRows(t *testing.T) *rowsBundle {
	store, pool := testdb.Store(t, nil)
	return &rowsBundle{ctx: t.Context(), store: store, pool: pool, rows: newRows(store)}
}

func (b *rowsBundle) claim(t *testing.T, key string) durable.Token {
	t.Helper()
	var owner durable.Token
	_, _ = rand.Read(owner[:])
	_, ok, err := b.store.Claim(b.ctx, durable.ClaimParams{Scope: "user-1", Key: key, Fingerprint: durable.Fingerprint{1}, Owner: owner})
	require.NoError(t, err)
	require.True(t, ok)
	return owner
}

func (b *rowsBundle) age(t *testing.T, key, by string) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `UPDATE `+b.store.Table()+` SET created_at = created_at - $2::interval WHERE user_id = 'user-1' AND key = $1`, key, by)
	require.NoError(t, err)
}

func (b *rowsBundle) state(t *testing.T, key string) (attempts int, after *time.Time, inFuture bool) {
	t.Helper()
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT reconcile_attempts, reconcile_after, coalesce(reconcile_after > now(), false)
FROM `+b.store.Table()+` WHERE user_id = 'user-1' AND key = $1`, key).Scan(&attempts, &after, &inFuture))
	return attempts, after, inFuture
}

func (b *rowsBundle) listDue(t *testing.T, olderThan time.Duration, limit int) ([]string, []dueRow) {
	t.Helper()
	ds, err := b.rows.listDue(b.ctx, b.pool, olderThan, limit)
	require.NoError(t, err)
	var keys []string
	for _, d := range ds {
		keys = append(keys, d.Key)
	}
	return keys, ds
}

// Due rows: live, in progress, older than the age, not postponed into the
// future; oldest first.
func TestRowsDue(t *testing.T) {
	b := setupRows(t)
	owners := map[string]durable.Token{}
	for key, age := range map[string]string{"k10": "10 minutes", "k30": "30 minutes", "k20": "20 minutes"} {
		owners[key] = b.claim(t, key)
		b.age(t, key, age)
	}
	b.claim(t, "fresh")
	done := b.claim(t, "done")
	require.NoError(t, b.store.Complete(b.ctx, "user-1", "done", done, durable.Answer{Status: 200}))
	b.age(t, "done", "40 minutes")
	b.claim(t, "expired")
	b.age(t, "expired", "25 hours")

	keys, ds := b.listDue(t, 5*time.Minute, 10)
	require.Equal(t, []string{"k30", "k20", "k10"}, keys)
	for _, d := range ds {
		require.Zero(t, d.Attempts)
		require.Equal(t, owners[d.Key], d.Owner)
		require.Equal(t, durable.Fingerprint{1}, d.Fingerprint)
	}
	keys, _ = b.listDue(t, 5*time.Minute, 2)
	require.Equal(t, []string{"k30", "k20"}, keys)
	keys, _ = b.listDue(t, 0, 10)
	require.Equal(t, []string{"k30", "k20", "k10", "fresh"}, keys)

	// Postponed: hidden until its time has come on the database clock.
	require.NoError(t, b.rows.postponeKey(b.ctx, b.pool, ds[0], 3, time.Hour))
	attempts, after, inFuture := b.state(t, "k30")
	require.Equal(t, 3, attempts)
	require.NotNil(t, after)
	require.True(t, inFuture)
	keys, _ = b.listDue(t, 5*time.Minute, 10)
	require.Equal(t, []string{"k20", "k10"}, keys)

	_, err := b.pool.Exec(b.ctx, `UPDATE `+b.store.Table()+` SET reconcile_after = now() - interval '1 second' WHERE key = 'k30'`)
	require.NoError(t, err)
	keys, ds = b.listDue(t, 5*time.Minute, 10)
	require.Equal(t, []string{"k30", "k20", "k10"}, keys)
	require.Equal(t, 3, ds[0].Attempts)
}

// Postpone acts on the listed claim only: another owner, a finished, missing
// or expired row is gone.
func TestRowsPostpone(t *testing.T) {
	b := setupRows(t)
	owner := b.claim(t, "key-1")
	d := dueRow{Scope: "user-1", Key: "key-1", Owner: owner}
	require.NoError(t, b.rows.postponeKey(b.ctx, b.pool, d, 1, 0))
	attempts, after, inFuture := b.state(t, "key-1")
	require.Equal(t, 1, attempts)
	require.NotNil(t, after)
	require.False(t, inFuture, "a zero delay is due at once")

	other := d
	other.Owner = durable.Token{9}
	require.ErrorIs(t, b.rows.postponeKey(b.ctx, b.pool, other, 2, time.Minute), errGone)
	missing := d
	missing.Key = "nope"
	require.ErrorIs(t, b.rows.postponeKey(b.ctx, b.pool, missing, 2, time.Minute), errGone)
	require.NoError(t, b.store.Complete(b.ctx, "user-1", "key-1", owner, durable.Answer{Status: 201}))
	require.ErrorIs(t, b.rows.postponeKey(b.ctx, b.pool, d, 2, time.Minute), errGone)

	q := dueRow{Scope: "user-1", Key: "key-2", Owner: b.claim(t, "key-2")}
	b.age(t, "key-2", "25 hours")
	require.ErrorIs(t, b.rows.postponeKey(b.ctx, b.pool, q, 1, time.Minute), errGone, "an expired row")
}

// A new intent that takes over an expired row does not inherit the backoff
// of the old one.
func TestTakeoverResetsReconcileState(t *testing.T) {
	b := setupRows(t)
	old := dueRow{Scope: "user-1", Key: "key-1", Owner: b.claim(t, "key-1")}
	require.NoError(t, b.rows.postponeKey(b.ctx, b.pool, old, 7, 48*time.Hour))
	b.age(t, "key-1", "25 hours")

	next := b.claim(t, "key-1")
	attempts, after, _ := b.state(t, "key-1")
	require.Zero(t, attempts)
	require.Nil(t, after)

	b.age(t, "key-1", "2 minutes")
	keys, ds := b.listDue(t, time.Minute, 10)
	require.Equal(t, []string{"key-1"}, keys)
	require.Equal(t, next, ds[0].Owner)
}
