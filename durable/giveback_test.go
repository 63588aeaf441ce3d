package durable_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
)

// A claim whose reply was lost may still be committing when the Guard gives
// it back (a client cut off mid-commit, a stalled synchronous standby). The
// give-back waits for that claim's transaction and releases its row once it
// has committed; a plain owner-checked release would run first, find no
// visible row and leave the key in progress with nothing behind it (issue
// 26, item 3). A claim that never arrived cannot take the key afterwards:
// the give-back leaves a released row in its place.
func TestGiveBackWaitsForTheClaimInFlight(t *testing.T) {
	b := setup(t, nil)
	p := params(t, "user-1", "in-flight", "a")

	// The claim, committing: its transaction holds the new row.
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	_, claimed, err := b.store.WithDB(tx).Claim(b.ctx, p)
	require.NoError(t, err)
	require.True(t, claimed)

	// The give-back, on a connection of its own, waits for it.
	conn, err := b.pool.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()
	var pid int
	require.NoError(t, conn.QueryRow(b.ctx, "SELECT pg_backend_pid()").Scan(&pid))
	done := make(chan error, 1)
	go func() { done <- b.store.WithDB(conn).GiveBack(b.ctx, p) }()
	require.Eventually(t, func() bool {
		var waiting bool
		err := b.pool.QueryRow(b.ctx, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid).Scan(&waiting)
		return err == nil && waiting
	}, 10*time.Second, 10*time.Millisecond, "the give-back waits for the claim's transaction")
	require.NoError(t, tx.Commit(b.ctx))
	require.NoError(t, <-done, "the committed claim is given back")

	_, err = b.store.Get(b.ctx, p.Scope, p.Key)
	require.ErrorIs(t, err, idem.ErrNotFound, "released")
	retry := params(t, p.Scope, p.Key, "a")
	rec, claimed, err := b.store.Claim(b.ctx, retry)
	require.NoError(t, err)
	require.True(t, claimed, "the retry runs")
	require.Equal(t, p.Owner, rec.Intent, "as the next attempt of the same intent")
	require.Equal(t, 2, rec.Attempt)

	// Given back again (its reply lost too): nothing more to give back.
	require.ErrorIs(t, b.store.GiveBack(b.ctx, p), idem.ErrNotOwner)

	// A claim that never committed: the key is left released, so that the
	// same statement arriving late finds a row and inserts nothing.
	q := params(t, "user-1", "never-arrived", "a")
	require.NoError(t, b.store.GiveBack(b.ctx, q))
	_, err = b.store.Get(b.ctx, q.Scope, q.Key)
	require.ErrorIs(t, err, idem.ErrNotFound)
	_, claimed, err = b.store.Claim(b.ctx, params(t, q.Scope, q.Key, "another body"))
	require.NoError(t, err)
	require.False(t, claimed, "the key was used for that request")
	_, claimed, err = b.store.Claim(b.ctx, params(t, q.Scope, q.Key, "a"))
	require.NoError(t, err)
	require.True(t, claimed, "its retry runs")
}
