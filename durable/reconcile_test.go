package durable_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/migrations"
)

// reconcileState reads the reconciliation columns of a row.
func (b *bundle) reconcileState(t *testing.T, scope, key string) (attempts int, after *time.Time, inFuture bool) {
	t.Helper()
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT reconcile_attempts, reconcile_after, coalesce(reconcile_after > now(), false)
FROM `+b.store.Table()+` WHERE user_id = $1 AND key = $2`, scope, key).Scan(&attempts, &after, &inFuture))
	return attempts, after, inFuture
}

// makeDue moves a postponed row's reconcile_after into the past.
func (b *bundle) makeDue(t *testing.T, scope, key string) {
	t.Helper()
	tag, err := b.pool.Exec(b.ctx, `UPDATE `+b.store.Table()+
		` SET reconcile_after = now() - interval '1 second' WHERE user_id = $1 AND key = $2`, scope, key)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
}

func dueKeys(t *testing.T, recs []durable.DueRecord) []string {
	var out []string
	for _, r := range recs {
		require.True(t, r.InProgress())
		out = append(out, r.Key)
	}
	return out
}

func TestListDue(t *testing.T) {
	b := setup(t, nil)
	owners := map[string]durable.Token{}
	for key, age := range map[string]string{"k10": "10 minutes", "k30": "30 minutes", "k20": "20 minutes"} {
		p := params(t, "user-1", key, "a")
		owners[key] = p.Owner
		b.claim(t, p)
		b.age(t, "user-1", key, age)
	}
	b.claim(t, params(t, "user-1", "fresh", "a"))
	done := params(t, "user-1", "done", "a")
	b.claim(t, done)
	require.NoError(t, b.store.Complete(b.ctx, done.Scope, done.Key, done.Owner, durable.Answer{Status: 200}))
	b.age(t, "user-1", "done", "40 minutes")
	b.claim(t, params(t, "user-1", "expired", "a"))
	b.age(t, "user-1", "expired", "25 hours")

	list := func(olderThan time.Duration, limit int) []durable.DueRecord {
		t.Helper()
		recs, err := b.store.ListDue(b.ctx, olderThan, limit)
		require.NoError(t, err)
		return recs
	}
	recs := list(5*time.Minute, 10)
	require.Equal(t, []string{"k30", "k20", "k10"}, dueKeys(t, recs))
	for _, r := range recs {
		require.Zero(t, r.Attempts)
		require.Equal(t, owners[r.Key], r.Owner)
	}
	require.Equal(t, []string{"k30", "k20"}, dueKeys(t, list(5*time.Minute, 2)))
	require.Equal(t, []string{"k30", "k20", "k10", "fresh"}, dueKeys(t, list(0, 10)))

	// Postponed: hidden until its time has come on the database clock.
	require.NoError(t, b.store.Postpone(b.ctx, "user-1", "k30", owners["k30"], 3, time.Hour))
	attempts, after, inFuture := b.reconcileState(t, "user-1", "k30")
	require.Equal(t, 3, attempts)
	require.NotNil(t, after)
	require.True(t, inFuture)
	require.Equal(t, []string{"k20", "k10"}, dueKeys(t, list(5*time.Minute, 10)))

	b.makeDue(t, "user-1", "k30")
	recs = list(5*time.Minute, 10)
	require.Equal(t, []string{"k30", "k20", "k10"}, dueKeys(t, recs))
	require.Equal(t, 3, recs[0].Attempts)

	// ListInProgress is unchanged: it lists postponed rows too.
	require.NoError(t, b.store.Postpone(b.ctx, "user-1", "k30", owners["k30"], 4, time.Hour))
	all, err := b.store.ListInProgress(b.ctx, 5*time.Minute, 10)
	require.NoError(t, err)
	require.Len(t, all, 3)

	_, err = b.store.ListDue(b.ctx, time.Minute, 0)
	require.ErrorIs(t, err, durable.ErrInvalid)
	_, err = b.store.ListDue(b.ctx, -time.Minute, 1)
	require.ErrorIs(t, err, durable.ErrInvalid)
}

func TestPostpone(t *testing.T) {
	b := setup(t, nil)
	p := params(t, "user-1", "key-1", "a")
	b.claim(t, p)

	require.NoError(t, b.store.Postpone(b.ctx, p.Scope, p.Key, p.Owner, 1, 0))
	attempts, after, inFuture := b.reconcileState(t, p.Scope, p.Key)
	require.Equal(t, 1, attempts)
	require.NotNil(t, after)
	require.False(t, inFuture, "a zero delay is due at once")

	require.ErrorIs(t, b.store.Postpone(b.ctx, p.Scope, p.Key, token(t), 2, time.Minute), durable.ErrNotOwner)
	require.ErrorIs(t, b.store.Postpone(b.ctx, p.Scope, "nope", p.Owner, 2, time.Minute), durable.ErrNotFound)
	require.ErrorIs(t, b.store.Postpone(b.ctx, p.Scope, p.Key, p.Owner, -1, time.Minute), durable.ErrInvalid)
	require.ErrorIs(t, b.store.Postpone(b.ctx, p.Scope, p.Key, p.Owner, 1, -time.Minute), durable.ErrInvalid)
	require.ErrorIs(t, b.store.Postpone(b.ctx, p.Scope, "k\x00", p.Owner, 1, time.Minute), durable.ErrInvalid)

	require.NoError(t, b.store.Complete(b.ctx, p.Scope, p.Key, p.Owner, durable.Answer{Status: 201}))
	require.ErrorIs(t, b.store.Postpone(b.ctx, p.Scope, p.Key, p.Owner, 2, time.Minute), durable.ErrCompleted)

	// An expired row is not found.
	q := params(t, "user-1", "key-2", "a")
	b.claim(t, q)
	b.age(t, q.Scope, q.Key, "25 hours")
	require.ErrorIs(t, b.store.Postpone(b.ctx, q.Scope, q.Key, q.Owner, 1, time.Minute), durable.ErrNotFound)
}

// TestTakeoverResetsReconcileState: a new intent that takes over an expired
// row does not inherit the backoff of the old one.
func TestTakeoverResetsReconcileState(t *testing.T) {
	b := setup(t, nil)
	old := params(t, "user-1", "key-1", "a")
	b.claim(t, old)
	require.NoError(t, b.store.Postpone(b.ctx, old.Scope, old.Key, old.Owner, 7, 48*time.Hour))
	b.age(t, old.Scope, old.Key, "25 hours")

	next := params(t, "user-1", "key-1", "b")
	b.claim(t, next)
	attempts, after, _ := b.reconcileState(t, next.Scope, next.Key)
	require.Zero(t, attempts)
	require.Nil(t, after)

	b.age(t, next.Scope, next.Key, "2 minutes")
	recs, err := b.store.ListDue(b.ctx, time.Minute, 10)
	require.NoError(t, err)
	require.Equal(t, []string{"key-1"}, dueKeys(t, recs))
	require.Equal(t, next.Owner, recs[0].Owner)
}

// TestMigration0002AsIs applies the reconcile columns the way golang-migrate
// would, on top of 0001, down and up again.
func TestMigration0002AsIs(t *testing.T) {
	b := setupMigrate(t)
	_, err := b.pool.Exec(b.ctx, "CREATE SCHEMA "+b.schema)
	require.NoError(t, err)
	conn, err := b.pool.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(b.ctx, "SET search_path TO "+b.schema)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(context.WithoutCancel(b.ctx), "RESET search_path") }()

	for _, name := range []string{
		"0001_create_idempotency_keys.up.sql",
		"0002_add_reconcile_columns.up.sql",
		"0002_add_reconcile_columns.down.sql",
		"0002_add_reconcile_columns.up.sql",
	} {
		sql, err := migrations.FS.ReadFile(name)
		require.NoError(t, err)
		_, err = conn.Exec(b.ctx, string(sql))
		require.NoError(t, err, name)
	}
	store, err := durable.New(conn.Conn(), nil)
	require.NoError(t, err)
	p := params(t, "user-1", "key-1", "a")
	_, claimed, err := store.Claim(b.ctx, p)
	require.NoError(t, err)
	require.True(t, claimed)
	require.NoError(t, store.Postpone(b.ctx, p.Scope, p.Key, p.Owner, 1, time.Minute))
}
