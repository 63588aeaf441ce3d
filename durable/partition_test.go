package durable_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/durable"
)

// TestMigratePartitioned: Migrate creates the hash-partitioned layout when
// asked, with every index and the fillfactor on each partition; it is then a
// no-op, refuses a Config that asks for another layout, and MigrateDown
// drops it all.
func TestMigratePartitioned(t *testing.T) {
	b := setupMigrate(t)
	cfg := &durable.Config{Schema: b.schema, Partitions: 4}
	require.NoError(t, durable.Migrate(b.ctx, b.pool, cfg))
	require.NoError(t, durable.Migrate(b.ctx, b.pool, cfg), "up to date: a no-op")
	require.Equal(t, []int64{1}, b.versions(t, "idempotency_keys"))

	table := pgx.Identifier{b.schema, "idempotency_keys"}.Sanitize()
	var kind, strategy string
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT c.relkind::text, pg_get_partkeydef(c.oid) FROM pg_class c WHERE c.oid = $1::regclass`, table).Scan(&kind, &strategy))
	require.Equal(t, "p", kind)
	require.Equal(t, "HASH (user_id)", strategy)

	rows, err := b.pool.Query(b.ctx, `
SELECT c.relname, coalesce(array_to_string(c.reloptions, ','), ''),
	(SELECT string_agg(i.relname, ',' ORDER BY i.relname) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid WHERE x.indrelid = c.oid),
	pg_get_expr(c.relpartbound, c.oid)
FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
WHERE h.inhparent = $1::regclass ORDER BY c.relname`, table)
	require.NoError(t, err)
	type part struct{ Name, Options, Indexes, Bound string }
	parts, err := pgx.CollectRows(rows, pgx.RowToStructByPos[part])
	require.NoError(t, err)
	require.Len(t, parts, 4)
	for i, p := range parts {
		name := "idempotency_keys_p" + string(rune('0'+i))
		require.Equal(t, name, p.Name)
		require.Equal(t, "fillfactor=93", p.Options, p.Name)
		require.Equal(t, name+"_created_at_idx,"+name+"_pkey,"+name+"_reconcile_after_idx", p.Indexes, p.Name)
		require.Equal(t, "FOR VALUES WITH (modulus 4, remainder "+string(rune('0'+i))+")", p.Bound)
	}

	for _, other := range []int{0, 8} {
		err := durable.Migrate(b.ctx, b.pool, &durable.Config{Schema: b.schema, Partitions: other})
		require.ErrorContains(t, err, "Config.Partitions", "partitions=%d", other)
	}

	require.NoError(t, durable.MigrateDown(b.ctx, b.pool, cfg))
	require.False(t, b.exists(t, "idempotency_keys"))
	require.False(t, b.exists(t, "idempotency_keys_p0"))
	require.Empty(t, b.versions(t, "idempotency_keys"))
}

// A plain table is never re-laid out: Migrate with Partitions refuses it.
func TestMigrateRefusesToPartitionAPlainTable(t *testing.T) {
	b := setupMigrate(t)
	require.NoError(t, durable.Migrate(b.ctx, b.pool, &durable.Config{Schema: b.schema}))
	err := durable.Migrate(b.ctx, b.pool, &durable.Config{Schema: b.schema, Partitions: 8})
	require.ErrorContains(t, err, "not partitioned but Config.Partitions is 8")
}
