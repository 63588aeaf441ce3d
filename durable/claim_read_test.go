package durable_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
)

// A claim that loses to a live row (a replay, a retry in progress, a reused
// key) must be a plain read: no transaction id is assigned, so nothing is
// locked, logged to WAL or flushed at commit. A claim that wins, or takes
// over an expired row, writes.
func TestLostClaimDoesNotWrite(t *testing.T) {
	b := setup(t, nil)
	p := params(t, "u", "live", "body")
	b.claim(t, p)

	xidAfter := func(claim idem.ClaimParams) (claimed, wrote bool) {
		t.Helper()
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			_, ok, err := b.store.WithDB(tx).Claim(b.ctx, claim)
			if err != nil {
				return err
			}
			claimed = ok
			var xid *int64
			if err := tx.QueryRow(b.ctx, `SELECT txid_current_if_assigned()`).Scan(&xid); err != nil {
				return err
			}
			wrote = xid != nil
			return nil
		})
		require.NoError(t, err)
		return claimed, wrote
	}

	for name, c := range map[string]idem.ClaimParams{
		"in progress, same request":  {Scope: "u", Key: "live", Fingerprint: p.Fingerprint, Owner: token(t)},
		"in progress, other request": params(t, "u", "live", "other"),
	} {
		claimed, wrote := xidAfter(c)
		require.False(t, claimed, name)
		require.False(t, wrote, "%s: a lost claim must not write", name)
	}

	require.NoError(t, b.store.Complete(b.ctx, "u", "live", p.Owner, idem.Response{Status: 201}))
	claimed, wrote := xidAfter(idem.ClaimParams{Scope: "u", Key: "live", Fingerprint: p.Fingerprint, Owner: token(t)})
	require.False(t, claimed)
	require.False(t, wrote, "a replay must not write")

	claimed, wrote = xidAfter(params(t, "u", "fresh", "body"))
	require.True(t, claimed)
	require.True(t, wrote)

	b.age(t, "u", "live", "25 hours")
	claimed, wrote = xidAfter(params(t, "u", "live", "new intent"))
	require.True(t, claimed, "an expired row is taken over")
	require.True(t, wrote)
}
