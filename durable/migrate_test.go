package durable_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/testdb"
	"github.com/idemguard/idem/migrations"
)

// migrateBundle is a pool and a fresh schema name that does not exist yet.
type migrateBundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	schema string
}

func setupMigrate(t *testing.T) *migrateBundle {
	t.Helper()
	t.Parallel()
	pool := testdb.Pool(t)
	return &migrateBundle{ctx: t.Context(), pool: pool, schema: testdb.SchemaName(t, pool)}
}

func (b *migrateBundle) exists(t *testing.T, name string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, b.pool.QueryRow(b.ctx, "SELECT to_regclass($1) IS NOT NULL",
		pgx.Identifier{b.schema, name}.Sanitize()).Scan(&ok))
	return ok
}

func (b *migrateBundle) versions(t *testing.T, table string) []int64 {
	t.Helper()
	rows, err := b.pool.Query(b.ctx,
		"SELECT version FROM "+pgx.Identifier{b.schema, "idem_migrations"}.Sanitize()+
			" WHERE table_name = $1 ORDER BY version", table)
	require.NoError(t, err)
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return versions
}

// objects returns the names of the relations (tables, indexes) and
// constraints in the schema.
func (b *migrateBundle) objects(t *testing.T) []string {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `
SELECT relname FROM pg_class WHERE relnamespace = $1::regnamespace AND relkind IN ('r', 'i')
UNION ALL
SELECT conname FROM pg_constraint WHERE connamespace = $1::regnamespace
ORDER BY 1`, b.schema)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

func TestMigrate(t *testing.T) {
	t.Run("creates the table, then is a no-op", func(t *testing.T) {
		b := setupMigrate(t)
		cfg := &durable.Config{Schema: b.schema}
		require.NoError(t, durable.Migrate(b.ctx, b.pool, cfg))
		require.True(t, b.exists(t, "idempotency_keys"))
		require.Equal(t, []int64{1}, b.versions(t, "idempotency_keys"))
		require.Equal(t, []string{
			"idem_migrations",
			"idem_migrations_pkey",
			"idem_migrations_pkey",
			"idempotency_keys",
			"idempotency_keys_created_at_idx",
			"idempotency_keys_leases",
			"idempotency_keys_leases_pkey",
			"idempotency_keys_leases_pkey",
			"idempotency_keys_pkey",
			"idempotency_keys_pkey",
			"idempotency_keys_reconcile",
			"idempotency_keys_reconcile_after_idx",
			"idempotency_keys_reconcile_one",
			"idempotency_keys_reconcile_pkey",
			"idempotency_keys_reconcile_pkey",
		}, b.objects(t))

		var comment string
		require.NoError(t, b.pool.QueryRow(b.ctx, "SELECT obj_description($1::regclass, 'pg_class')",
			pgx.Identifier{b.schema, "idempotency_keys"}.Sanitize()).Scan(&comment))
		require.NotEmpty(t, comment)

		var appliedAt time.Time
		require.NoError(t, b.pool.QueryRow(b.ctx, "SELECT applied_at FROM "+
			pgx.Identifier{b.schema, "idem_migrations"}.Sanitize()).Scan(&appliedAt))
		require.NoError(t, durable.Migrate(b.ctx, b.pool, cfg))
		var again time.Time
		require.NoError(t, b.pool.QueryRow(b.ctx, "SELECT applied_at FROM "+
			pgx.Identifier{b.schema, "idem_migrations"}.Sanitize()).Scan(&again))
		require.Equal(t, appliedAt, again, "nothing re-applied")
	})

	t.Run("concurrent calls on a fresh schema", func(t *testing.T) {
		b := setupMigrate(t)
		const n = 8
		var (
			wg    sync.WaitGroup
			start = make(chan struct{})
			errs  [n]error
		)
		for i := range n {
			wg.Go(func() {
				<-start
				errs[i] = durable.Migrate(b.ctx, b.pool, &durable.Config{Schema: b.schema})
			})
		}
		close(start)
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		require.True(t, b.exists(t, "idempotency_keys"))
		require.Equal(t, []int64{1}, b.versions(t, "idempotency_keys"))
	})

	t.Run("concurrent calls for four schemas", func(t *testing.T) {
		// Different schemas take different advisory locks: each is
		// migrated once, whatever the others do.
		b := setupMigrate(t)
		schemas := []string{b.schema + "_a", b.schema + "_b", b.schema + "_c", b.schema + "_d"}
		t.Cleanup(func() {
			for _, s := range schemas {
				_, _ = b.pool.Exec(context.WithoutCancel(b.ctx), "DROP SCHEMA IF EXISTS "+s+" CASCADE")
			}
		})
		var (
			wg    sync.WaitGroup
			start = make(chan struct{})
			errs  = make([]error, 2*len(schemas))
		)
		for i := range errs {
			wg.Go(func() {
				<-start
				errs[i] = durable.Migrate(b.ctx, b.pool, &durable.Config{Schema: schemas[i%len(schemas)]})
			})
		}
		close(start)
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		for _, schema := range schemas {
			var n int
			require.NoError(t, b.pool.QueryRow(b.ctx, "SELECT count(*) FROM "+schema+".idem_migrations").Scan(&n))
			require.Equal(t, 1, n, schema)
		}
	})

	t.Run("current schema", func(t *testing.T) {
		b := setupMigrate(t)
		_, err := b.pool.Exec(b.ctx, "CREATE SCHEMA "+b.schema)
		require.NoError(t, err)
		conn, err := b.pool.Acquire(b.ctx)
		require.NoError(t, err)
		defer conn.Release()
		_, err = conn.Exec(b.ctx, "SET search_path TO "+b.schema)
		require.NoError(t, err)
		defer func() { _, _ = conn.Exec(context.WithoutCancel(b.ctx), "RESET search_path") }()

		require.NoError(t, durable.Migrate(b.ctx, conn.Conn(), nil))
		require.True(t, b.exists(t, "idempotency_keys"))
		store, err := durable.New(conn.Conn(), nil)
		require.NoError(t, err)
		require.Equal(t, `"idempotency_keys"`, store.Table())
		_, claimed, err := store.Claim(b.ctx, params(t, "user-1", "key-1", "a"))
		require.NoError(t, err)
		require.True(t, claimed)
	})

	t.Run("inside a caller's transaction", func(t *testing.T) {
		b := setupMigrate(t)
		tx, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.WithoutCancel(b.ctx)) }()
		var before, after string
		require.NoError(t, tx.QueryRow(b.ctx, "SHOW search_path").Scan(&before))
		require.NoError(t, durable.Migrate(b.ctx, tx, &durable.Config{Schema: b.schema}))
		require.NoError(t, tx.QueryRow(b.ctx, "SHOW search_path").Scan(&after))
		require.Equal(t, before, after)
		require.NoError(t, tx.Rollback(b.ctx))
		require.False(t, b.exists(t, "idempotency_keys"), "rolled back with the caller's transaction")
	})
}

func TestMigrateDown(t *testing.T) {
	b := setupMigrate(t)
	cfg := &durable.Config{Schema: b.schema}
	other := &durable.Config{Schema: b.schema + "_other"}
	t.Cleanup(func() {
		_, _ = b.pool.Exec(context.WithoutCancel(b.ctx), "DROP SCHEMA IF EXISTS "+other.Schema+" CASCADE")
	})

	require.NoError(t, durable.MigrateDown(b.ctx, b.pool, cfg), "nothing to undo")
	require.NoError(t, durable.Migrate(b.ctx, b.pool, cfg))
	require.NoError(t, durable.Migrate(b.ctx, b.pool, other))

	require.NoError(t, durable.MigrateDown(b.ctx, b.pool, cfg))
	require.False(t, b.exists(t, "idempotency_keys"))
	require.Empty(t, b.versions(t, "idempotency_keys"))
	var kept bool
	require.NoError(t, b.pool.QueryRow(b.ctx, "SELECT to_regclass($1) IS NOT NULL", other.Schema+".idempotency_keys").Scan(&kept))
	require.True(t, kept, "another schema's table untouched")

	require.NoError(t, durable.MigrateDown(b.ctx, b.pool, cfg), "no-op the second time")
	require.NoError(t, durable.Migrate(b.ctx, b.pool, cfg), "can migrate up again")
	require.True(t, b.exists(t, "idempotency_keys"))
}

// TestMigrationFilesAsIs runs the files the way golang-migrate would: plain
// SQL on a connection whose search_path is the target schema.
func TestMigrationFilesAsIs(t *testing.T) {
	b := setupMigrate(t)
	b.applyFiles(t, b.schemaConn(t),
		"0001_create_idempotency_keys.up.sql",
		"0001_create_idempotency_keys.down.sql",
		"0001_create_idempotency_keys.up.sql")
	require.True(t, b.exists(t, "idempotency_keys"))
}

// schemaConn creates the bundle's schema and returns a connection whose
// search_path is that schema, as golang-migrate would use, released (and its
// search_path reset) at the end of t.
func (b *migrateBundle) schemaConn(t *testing.T) *pgxpool.Conn {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, "CREATE SCHEMA "+b.schema)
	require.NoError(t, err)
	conn, err := b.pool.Acquire(b.ctx)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = conn.Exec(context.WithoutCancel(b.ctx), "RESET search_path")
		conn.Release()
	})
	_, err = conn.Exec(b.ctx, "SET search_path TO "+b.schema)
	require.NoError(t, err)
	return conn
}

// applyFiles runs the migration files named, in order, as plain SQL on conn.
func (b *migrateBundle) applyFiles(t *testing.T, conn *pgxpool.Conn, names ...string) {
	t.Helper()
	for _, name := range names {
		sql, err := migrations.FS.ReadFile(name)
		require.NoError(t, err)
		_, err = conn.Exec(b.ctx, string(sql))
		require.NoError(t, err, name)
	}
}
