package durable_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/testdb"
)

// Inspect reads a row in every state, with its hold and retention counted on
// the database's clock.
func TestInspect(t *testing.T) {
	b := setup(t, nil)

	_, err := b.store.Inspect(b.ctx, "u", "none")
	require.ErrorIs(t, err, idem.ErrNotFound)

	p := params(t, "u", "held", "a")
	p.Hold = time.Hour
	rec := b.claim(t, p)
	row, err := b.store.Inspect(b.ctx, "u", "held")
	require.NoError(t, err)
	require.Equal(t, durable.StateInProgress, row.State)
	require.True(t, row.Held())
	require.InDelta(t, time.Hour, row.HoldLeft, float64(time.Minute))
	require.Equal(t, rec.Owner, row.Owner)
	require.Equal(t, p.Fingerprint, row.Fingerprint)
	require.Nil(t, row.Answer)

	// Past its hold: pending.
	b.claim(t, params(t, "u", "pending", "a"))
	row, err = b.store.Inspect(b.ctx, "u", "pending")
	require.NoError(t, err)
	require.False(t, row.Held())
	require.LessOrEqual(t, row.HoldLeft, time.Duration(0))

	// Answered, then expired once aged past the retention.
	done := b.claim(t, params(t, "u", "done", "a"))
	require.NoError(t, b.store.Complete(b.ctx, "u", "done", done.Owner, idem.Response{Status: 201, Body: []byte("ok")}))
	row, err = b.store.Inspect(b.ctx, "u", "done")
	require.NoError(t, err)
	require.Equal(t, durable.StateAnswered, row.State)
	require.Equal(t, 201, row.Answer.Status)
	require.InDelta(t, durable.DefaultRetention, row.TTL, float64(time.Minute))
	b.age(t, "u", "done", "25 hours")
	row, err = b.store.Inspect(b.ctx, "u", "done")
	require.NoError(t, err)
	require.Equal(t, durable.StateExpired, row.State)
	require.Negative(t, row.TTL)

	// Released.
	rel := b.claim(t, params(t, "u", "rel", "a"))
	require.NoError(t, b.store.Release(b.ctx, "u", "rel", rel.Owner))
	row, err = b.store.Inspect(b.ctx, "u", "rel")
	require.NoError(t, err)
	require.Equal(t, durable.StateReleased, row.State)
	require.False(t, row.ReleasedAt.IsZero())
}

// ListPending lists keys in progress past their hold, oldest first, and
// CountStates counts every state.
func TestListPendingAndCountStates(t *testing.T) {
	b := setup(t, nil)
	old := b.claim(t, params(t, "u", "old", "a"))
	b.age(t, "u", "old", "2 hours")
	young := b.claim(t, params(t, "u", "young", "a"))
	held := params(t, "u", "held", "a")
	held.Hold = time.Hour
	b.claim(t, held)
	done := b.claim(t, params(t, "u", "done", "a"))
	require.NoError(t, b.store.Complete(b.ctx, "u", "done", done.Owner, idem.Response{Status: 200}))
	rel := b.claim(t, params(t, "u", "rel", "a"))
	require.NoError(t, b.store.Release(b.ctx, "u", "rel", rel.Owner))
	b.age(t, "u", "rel", "25 hours")

	rows, err := b.store.ListPending(b.ctx, 10)
	require.NoError(t, err)
	require.Len(t, rows, 2)
	require.Equal(t, old.Owner, rows[0].Owner)
	require.Equal(t, young.Owner, rows[1].Owner)
	rows, err = b.store.ListPending(b.ctx, 1)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	_, err = b.store.ListPending(b.ctx, 0)
	require.ErrorIs(t, err, idem.ErrInvalid)

	n, err := b.store.CountStates(b.ctx)
	require.NoError(t, err)
	require.Equal(t, durable.StateCounts{InProgress: 3, Pending: 2, Answered: 1, Released: 0, Expired: 1}, n)
}

// MigrationStatus reports what is applied; MigrateDownTo undoes the
// versions above the one it is given.
func TestMigrationStatusAndDownTo(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	cfg := &durable.Config{Schema: testdb.SchemaName(t, pool)}
	applied := func() (versions []int64) {
		t.Helper()
		vs, err := durable.MigrationStatus(t.Context(), pool, cfg)
		require.NoError(t, err)
		for _, v := range vs {
			require.NotEmpty(t, v.Name)
			if v.Applied {
				require.False(t, v.AppliedAt.IsZero())
				versions = append(versions, v.Version)
			}
		}
		return versions
	}
	require.Empty(t, applied(), "no version table yet")
	require.NoError(t, durable.Migrate(t.Context(), pool, cfg))
	require.Equal(t, []int64{1}, applied())
	require.NoError(t, durable.MigrateDownTo(t.Context(), pool, cfg, 1), "nothing above 1: a no-op")
	require.Equal(t, []int64{1}, applied())
	require.ErrorIs(t, durable.MigrateDownTo(t.Context(), pool, cfg, -1), idem.ErrInvalid)
	require.NoError(t, durable.MigrateDownTo(t.Context(), pool, cfg, 0))
	require.Empty(t, applied())
}
