package durable_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/testdb"
)

// Behind PgBouncer in transaction mode (1.18, which keeps no prepared
// statements), pgx's default statement cache makes statements fail at
// random with SQLSTATE 26000 or 42P05 (200 of 400 requests got 503 in the
// review, and answers stayed unstored). Migrate, run at start, finds it and
// says how to connect; with default_query_exec_mode=cache_describe, or
// directly, it passes (issue 26, item 6).
func TestMigrateRefusesAPoolerThatLosesStatements(t *testing.T) {
	direct := testdb.Pool(t)
	cfg := &durable.Config{Schema: testdb.Schema(t, direct)}
	require.NoError(t, durable.Migrate(t.Context(), direct, cfg), "directly")
	require.NoError(t, durable.Migrate(t.Context(), testdb.BouncerPool(t), cfg), "through PgBouncer with cache_describe")

	url, cached := strings.CutSuffix(testdb.BouncerURL(), "&default_query_exec_mode=cache_describe")
	require.True(t, cached, "the test's PgBouncer URL asks for cache_describe: %s", url)
	pool, err := pgxpool.New(t.Context(), url) // pgx's default: cache_statement
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	err = durable.Migrate(t.Context(), pool, cfg)
	require.ErrorIs(t, err, durable.ErrStatementCache)
	require.ErrorContains(t, err, "default_query_exec_mode=cache_describe")
}

// Every statement's error names the cause too, for a pool the check could
// not see through.
func TestLostStatementErrorsNameTheCause(t *testing.T) {
	for _, code := range []string{"26000", "42P05"} {
		err := durable.Translate("claim", &pgconn.PgError{Code: code, Message: "prepared statement \"stmtcache_1\""})
		require.ErrorIs(t, err, durable.ErrStatementCache, code)
		require.ErrorContains(t, err, "durable: claim: prepared statements are lost between transactions")
	}
}
