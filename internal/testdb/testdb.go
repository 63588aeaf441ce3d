// Package testdb gives tests a real PostgreSQL: a pool, a schema of their
// own that is dropped when they end, and a migrated durable.Store.
//
// The database is $TEST_DATABASE_URL, by default
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable. When it cannot
// be reached, tests are skipped, except under CI=true, where they fail.
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemguard/idem/durable"
)

// DefaultURL is the database used when TEST_DATABASE_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// URL returns $TEST_DATABASE_URL, or DefaultURL when it is unset.
func URL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// Pool returns a new pool connected to URL(), closed when tb ends. When the
// database does not answer a ping within a few seconds, Pool skips tb, or
// fails it when the environment variable CI is "true": CI must never skip.
func Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	where := redact(URL())
	cfg, err := pgxpool.ParseConfig(URL())
	if err != nil {
		tb.Fatalf("testdb: TEST_DATABASE_URL: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
		if err != nil {
			pool.Close()
		}
	}
	if err != nil {
		const how = "start PostgreSQL on 127.0.0.1:5432 with trust auth " +
			"(e.g. docker run -d -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:15) " +
			"or point TEST_DATABASE_URL at one"
		if os.Getenv("CI") == "true" {
			tb.Fatalf("testdb: PostgreSQL unreachable at %s: %v", where, err)
		}
		tb.Skipf("testdb: PostgreSQL unreachable at %s: %v; %s", where, err, how)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// SchemaName returns a unique schema name, idemtest_<random hex>, without
// creating the schema, and drops it (CASCADE, if it exists) when tb ends. It
// is for tests of code that creates the schema itself.
func SchemaName(tb testing.TB, pool *pgxpool.Pool) string {
	tb.Helper()
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails
	name := "idemtest_" + hex.EncodeToString(b[:])
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			tb.Errorf("testdb: drop schema %s: %v", name, err)
		}
	})
	return name
}

// Schema creates a uniquely named schema, idemtest_<random hex>, and returns
// its name. It is dropped with everything in it when tb ends.
func Schema(tb testing.TB, pool *pgxpool.Pool) string {
	tb.Helper()
	name := SchemaName(tb, pool)
	if _, err := pool.Exec(tb.Context(), "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Fatalf("testdb: create schema %s: %v", name, err)
	}
	return name
}

// Store returns a durable.Store on a fresh, migrated schema of its own, and
// the pool it uses. cfg may be nil; its Schema is replaced by the fresh one.
//
// When cfg leaves Partitions at 0, $IDEM_TEST_PARTITIONS (a number) sets it,
// so that a whole test suite runs on the hash-partitioned layout.
func Store(tb testing.TB, cfg *durable.Config) (*durable.Store, *pgxpool.Pool) {
	tb.Helper()
	pool := Pool(tb)
	var c durable.Config
	if cfg != nil {
		c = *cfg
	}
	if c.Partitions == 0 {
		if v := os.Getenv("IDEM_TEST_PARTITIONS"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				tb.Fatalf("testdb: IDEM_TEST_PARTITIONS: %v", err)
			}
			c.Partitions = n
		}
	}
	if c.AdmissionWait == 0 {
		// Tests race many requests on a small pool of a busy machine:
		// they test other guarantees than admission, which
		// TestAdmissionFailsFastWhenThePoolIsBusy tests.
		c.AdmissionWait = time.Minute
	}
	c.Schema = Schema(tb, pool)
	if err := durable.Migrate(tb.Context(), pool, &c); err != nil {
		tb.Fatalf("testdb: %v", err)
	}
	store, err := durable.New(pool, &c)
	if err != nil {
		tb.Fatalf("testdb: %v", err)
	}
	return store, pool
}

// redact hides the password of a URL-style connection string in messages.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	return u.Redacted()
}
