// Package pgtest gives your tests a real PostgreSQL store, for what the
// in-memory idemtest.MemStore cannot do: join a transaction. A handler that
// stores its answer in its own transaction (idem.Complete) runs, under test,
// against a *durable.Store on a schema of the test's own.
//
// The database is $TEST_DATABASE_URL, by default
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable. When it does
// not answer, the test is skipped, except under CI=true, where it fails: CI
// must never skip.
//
// It is a package of its own so that a test importing idemtest for MemStore
// links no pgx.
package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/testdb"
)

// Store returns a *durable.Store on a fresh schema, idemtest_<random hex>,
// migrated with durable.Migrate, and a pool whose connections have that
// schema as their search_path, so that your own tables, created and queried
// without a schema name, live beside the store's. Both are the test's own:
// tests that call Store may run in parallel. The schema is dropped, with
// everything in it, and the pool closed when tb ends.
//
// cfg may be nil; its Schema is replaced by the fresh one.
func Store(tb testing.TB, cfg *durable.Config) (*durable.Store, *pgxpool.Pool) {
	tb.Helper()
	admin := testdb.Pool(tb) // skips, or fails under CI=true, without PostgreSQL
	var c durable.Config
	if cfg != nil {
		c = *cfg
	}
	c.Schema = testdb.Schema(tb, admin)
	pc, err := pgxpool.ParseConfig(testdb.URL())
	if err != nil {
		tb.Fatalf("pgtest: TEST_DATABASE_URL: %v", err)
	}
	pc.ConnConfig.RuntimeParams["search_path"] = c.Schema
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(pool.Close) // before the schema is dropped
	if err := durable.Migrate(ctx, pool, &c); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	store, err := durable.New(pool, &c)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	return store, pool
}
