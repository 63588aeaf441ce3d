package durable_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
)

// TestMigrationsAsIs applies the migration files the way golang-migrate
// would, as plain SQL: up, down and up again. The store then works on the
// result, and the table has what the migration promises: the fillfactor
// that keeps answer writes HOT, and the reconciler's and the leases' tables.
func TestMigrationsAsIs(t *testing.T) {
	b := setupMigrate(t)
	conn := b.schemaConn(t)
	b.applyFiles(t, conn,
		"0001_create_idempotency_keys.up.sql",
		"0001_create_idempotency_keys.down.sql",
		"0001_create_idempotency_keys.up.sql")
	store, err := durable.New(conn.Conn(), nil)
	require.NoError(t, err)
	p := params(t, "user-1", "key-1", "a")
	_, claimed, err := store.Claim(b.ctx, p)
	require.NoError(t, err)
	require.True(t, claimed)
	var attempts int
	var after *string
	require.NoError(t, conn.QueryRow(b.ctx, `SELECT reconcile_attempts, reconcile_after::text FROM idempotency_keys`).Scan(&attempts, &after))
	require.Zero(t, attempts)
	require.Nil(t, after)
	require.NoError(t, store.Complete(b.ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 201}))

	var opts []string
	require.NoError(t, conn.QueryRow(b.ctx, `SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = 'idempotency_keys'::regclass`).Scan(&opts))
	require.Equal(t, []string{"fillfactor=93"}, opts)
	for _, table := range []string{"idempotency_keys_reconcile", "idempotency_keys_leases"} {
		var n int
		require.NoError(t, conn.QueryRow(b.ctx, `SELECT count(*) FROM `+table).Scan(&n))
		require.Zero(t, n, table)
	}
	var checks int
	require.NoError(t, conn.QueryRow(b.ctx, `SELECT count(*) FROM pg_constraint
WHERE conrelid = 'idempotency_keys'::regclass AND contype = 'c'`).Scan(&checks))
	require.Zero(t, checks, "no CHECK constraint: every write would pay for it")
}
