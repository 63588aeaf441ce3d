package durable_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
)

// TestMigrationsAsIs applies the migration files the way golang-migrate
// would, each later one down and up again, and checks that the store works on
// the result.
func TestMigrationsAsIs(t *testing.T) {
	b := setupMigrate(t)
	conn := b.schemaConn(t)
	b.applyFiles(t, conn,
		"0001_create_idempotency_keys.up.sql",
		"0002_add_reconcile_columns.up.sql",
		"0002_add_reconcile_columns.down.sql",
		"0002_add_reconcile_columns.up.sql",
		"0003_hot_answer_writes.up.sql",
		"0003_hot_answer_writes.down.sql",
		"0003_hot_answer_writes.up.sql",
		"0004_drop_check_constraints.up.sql")
	// 0004's down file restores the CHECK constraints; up drops them again.
	checks := func() int {
		var n int
		require.NoError(t, conn.QueryRow(b.ctx, `SELECT count(*) FROM pg_constraint
WHERE conrelid = 'idempotency_keys'::regclass AND contype = 'c'`).Scan(&n))
		return n
	}
	require.Zero(t, checks())
	b.applyFiles(t, conn, "0004_drop_check_constraints.down.sql")
	require.Equal(t, 4, checks())
	b.applyFiles(t, conn, "0004_drop_check_constraints.up.sql")
	require.Zero(t, checks())
	b.applyFiles(t, conn,
		"0005_key_lifecycle.up.sql",
		"0005_key_lifecycle.down.sql",
		"0005_key_lifecycle.up.sql")
	store, err := durable.New(conn.Conn(), nil)
	require.NoError(t, err)
	p := params(t, "user-1", "key-1", "a")
	_, claimed, err := store.Claim(b.ctx, p)
	require.NoError(t, err)
	require.True(t, claimed)
	// The reconciler's columns are there, with their defaults.
	var attempts int
	var after *string
	require.NoError(t, conn.QueryRow(b.ctx, `SELECT reconcile_attempts, reconcile_after::text FROM idempotency_keys`).Scan(&attempts, &after))
	require.Zero(t, attempts)
	require.Nil(t, after)
	require.NoError(t, store.Complete(b.ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 201}))

	// 0003 then 0005: fillfactor on the table, the reconciler's index and state table.
	var opts []string
	require.NoError(t, conn.QueryRow(b.ctx, `SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = 'idempotency_keys'::regclass`).Scan(&opts))
	require.Equal(t, []string{"fillfactor=93"}, opts)
	var n int
	require.NoError(t, conn.QueryRow(b.ctx, `SELECT count(*) FROM idempotency_keys_reconcile`).Scan(&n))
	require.Zero(t, n)
}
