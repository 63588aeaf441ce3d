package durable

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
)

// TestPassedLeaseIsNotRenewed: once a holder's lease has expired on the
// database's clock, its renewal fails even though nobody took the lease
// since, and its fenced writes stay refused. A renewal sent before a pause
// and arriving after it would otherwise open a second term, after another
// holder's, in which the writes it decided in the first one land.
func TestPassedLeaseIsNotRenewed(t *testing.T) {
	ctx := t.Context()
	s, pool := planStore(t)
	l, err := newLeader(pool, s.table, "job", time.Minute)
	require.NoError(t, err)
	p := idem.ClaimParams{Scope: "u", Key: "k", Owner: idem.Token{1}}
	_, claimed, err := s.Claim(ctx, p)
	require.NoError(t, err)
	require.True(t, claimed)
	fenced := withFence(ctx, fence{leases: l.leases, job: "job", holder: "A"})

	_, err = l.hold(ctx, l.sql.take, "A")
	require.NoError(t, err)
	_, err = l.hold(ctx, l.sql.renew, "A")
	require.NoError(t, err, "a live lease is renewed")
	_, err = l.hold(ctx, l.sql.take, "B")
	require.ErrorIs(t, err, ErrLocked, "and not taken by another")

	_, err = pool.Exec(ctx, `UPDATE `+l.leases+` SET expires_at = now() - interval '1 millisecond'`)
	require.NoError(t, err)
	_, err = l.hold(ctx, l.sql.renew, "A")
	require.ErrorIs(t, err, ErrLocked, "a lease that passed is not renewed")
	require.ErrorIs(t, s.Release(fenced, p.Scope, p.Key, p.Owner), ErrLeaseLost)

	_, err = l.hold(ctx, l.sql.take, "B")
	require.NoError(t, err, "it is taken by the next holder")
	require.ErrorIs(t, s.Release(fenced, p.Scope, p.Key, p.Owner), ErrLeaseLost)
	_, err = l.hold(ctx, l.sql.renew, "A")
	require.ErrorIs(t, err, ErrLocked)
	rec, err := s.Get(ctx, p.Scope, p.Key)
	require.NoError(t, err)
	require.True(t, rec.InProgress(), "nothing A wrote landed")
}
