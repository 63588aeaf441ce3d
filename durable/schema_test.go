package durable_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/clock"
)

// TestSchemaAhead runs this build's statements against its table migrated
// one version ahead, as by a newer build during a deploy: a Store refuses to
// serve it, at once if it has not read the version yet and within a minute
// if it has; so do Migrate, the sweeper and the reconciler's listings. None
// changes a row.
func TestSchemaAhead(t *testing.T) {
	b := setup(t, nil)
	running := b.store
	p := params(t, "user-1", "key-1", "a")
	_, claimed, err := running.Claim(b.ctx, p)
	require.NoError(t, err)
	require.True(t, claimed)

	// A newer build's migration: the next version, recorded as every
	// migration records it.
	view := b.store.Table()[:len(b.store.Table())-1] + `_schema"`
	_, err = b.pool.Exec(b.ctx, `CREATE OR REPLACE VIEW `+view+` AS SELECT 2 AS version`)
	require.NoError(t, err)

	ahead := func(t *testing.T, err error) {
		t.Helper()
		require.Error(t, err)
		require.ErrorContains(t, err, "is at schema version 2 and this build serves version 1: deploy a build that serves version 2")
		require.NotErrorIs(t, err, idem.ErrNotFound)
	}
	fresh, err := durable.New(b.pool, &durable.Config{Schema: schemaOf(b.store)})
	require.NoError(t, err)
	_, _, err = fresh.Claim(b.ctx, params(t, "user-1", "key-2", "a"))
	ahead(t, err)
	_, err = fresh.Get(b.ctx, p.Scope, p.Key)
	ahead(t, err)
	_, err = fresh.ListPostponed(b.ctx, 10)
	ahead(t, err)
	_, _, err = fresh.ScanWindow(b.ctx, time.Minute, time.Minute)
	ahead(t, err)
	_, err = fresh.Inspect(b.ctx, p.Scope, p.Key)
	ahead(t, err)
	sw, err := durable.NewSweeper(fresh)
	require.NoError(t, err)
	_, err = sw.SweepOnce(b.ctx)
	ahead(t, err)

	// The Store that read the version before goes on for up to a minute,
	// then refuses too.
	var moved clock.Offset
	durable.SchemaClock(running, moved.Now)
	_, err = running.Get(b.ctx, p.Scope, p.Key)
	require.NoError(t, err, "read a minute ago at most: served")
	moved.Advance(time.Minute)
	_, err = running.Get(b.ctx, p.Scope, p.Key)
	ahead(t, err)
	_, err = running.Get(b.ctx, p.Scope, p.Key)
	ahead(t, err) // every call reads the version again until it is right

	// Nothing was written: the first claim is still the only row.
	require.Equal(t, 1, b.count(t))
	_, err = b.pool.Exec(b.ctx, `CREATE OR REPLACE VIEW `+view+` AS SELECT 1 AS version`)
	require.NoError(t, err)
	rec, err := running.Get(b.ctx, p.Scope, p.Key)
	require.NoError(t, err, "back at its version: served again")
	require.Equal(t, p.Owner, rec.Owner)
}

// TestMigrateRefusesANewerTable: a table a newer build migrated (a version
// this build has no file for) is refused by Migrate, which changes nothing.
func TestMigrateRefusesANewerTable(t *testing.T) {
	b := setupMigrate(t)
	cfg := &durable.Config{Schema: b.schema}
	require.NoError(t, durable.Migrate(b.ctx, b.pool, cfg))
	_, err := b.pool.Exec(b.ctx, `INSERT INTO `+b.schema+`.idem_migrations (table_name, version) VALUES ('idempotency_keys', 2)`)
	require.NoError(t, err)
	err = durable.Migrate(b.ctx, b.pool, cfg)
	require.ErrorContains(t, err, "version 2 is applied to")
	require.ErrorContains(t, err, "this build has no such migration (it serves version 1)")
	require.Equal(t, []int64{1, 2}, b.versions(t, "idempotency_keys"))
}

// TestSchemaNotMigrated: a Store over a schema without the table says to
// run durable.Migrate.
func TestSchemaNotMigrated(t *testing.T) {
	b := setupMigrate(t)
	_, err := b.pool.Exec(b.ctx, "CREATE SCHEMA "+b.schema)
	require.NoError(t, err)
	store, err := durable.New(b.pool, &durable.Config{Schema: b.schema})
	require.NoError(t, err)
	_, _, err = store.Claim(context.Background(), params(t, "user-1", "key-1", "a"))
	require.ErrorContains(t, err, "run durable.Migrate")
}
