package durable_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/testdb"
)

// bundle is what a stateful test works with: a Store on a schema of its own.
type bundle struct {
	ctx   context.Context
	store *durable.Store
	pool  *pgxpool.Pool
}

func setup(t *testing.T, cfg *durable.Config) *bundle {
	t.Helper()
	t.Parallel()
	store, pool := testdb.Store(t, cfg)
	return &bundle{ctx: t.Context(), store: store, pool: pool}
}

// sweep runs one sweep of b's table (Sweeper.SweepOnce), batch rows per
// DELETE (0: the default).
func (b *bundle) sweep(t *testing.T, ctx context.Context, batch int) (int64, error) {
	t.Helper()
	sw, err := durable.NewSweeper(b.store)
	require.NoError(t, err)
	return durable.TuneSweeper(sw, durable.SweeperTuning{BatchSize: batch, BatchPause: -1}).SweepOnce(ctx)
}

func token(t testing.TB) idem.Token {
	t.Helper()
	var tok idem.Token
	_, err := rand.Read(tok[:])
	require.NoError(t, err)
	return tok
}

func fingerprint(body string) idem.Fingerprint {
	return sha256.Sum256([]byte(body))
}

func params(t testing.TB, scope, key, body string) idem.ClaimParams {
	return idem.ClaimParams{Scope: scope, Key: key, Fingerprint: fingerprint(body), Owner: token(t)}
}

// age moves a row into the past, on the database clock, so that it was
// claimed an interval such as '25 hours' ago: its created_at, and its
// completed_at, released_at and hold_until by as much.
func (b *bundle) age(t *testing.T, scope, key, by string) {
	t.Helper()
	tag, err := b.pool.Exec(b.ctx,
		`UPDATE `+b.store.Table()+` SET created_at = now() - $3::interval,
			completed_at = completed_at - (created_at - (now() - $3::interval)),
			released_at = released_at - (created_at - (now() - $3::interval)),
			hold_until = hold_until - (created_at - (now() - $3::interval))
		WHERE user_id = $1 AND key = $2`,
		scope, key, by)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
}

// count returns the number of rows in the table, expired or not.
func (b *bundle) count(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM `+b.store.Table()).Scan(&n))
	return n
}

// claim claims a fresh key and requires that it wins.
func (b *bundle) claim(t *testing.T, p idem.ClaimParams) idem.Record {
	t.Helper()
	rec, claimed, err := b.store.Claim(b.ctx, p)
	require.NoError(t, err)
	require.True(t, claimed)
	return rec
}

// retentionSQL is store's retention as an SQL interval literal, for rows a
// test inserts as the store would have claimed them.
func retentionSQL(store *durable.Store) string {
	return fmt.Sprintf("interval '%d microseconds'", store.Retention().Microseconds())
}

// schemaOf is the schema of store's table.
func schemaOf(store *durable.Store) string {
	schema, _, _ := strings.Cut(strings.Trim(store.Table(), `"`), `"."`)
	return schema
}
