package durable_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
)

// TestRowsKeepTheirRetention: a row keeps the retention of the Store that
// claimed it, raised by a Store with a longer one that answers, releases or
// gives it back, never lowered; a takeover of an expired row starts a new
// intent under the claimer's own. Readers of any retention go by the row's.
func TestRowsKeepTheirRetention(t *testing.T) {
	b := setup(t, &durable.Config{Retention: time.Hour})
	long := b.store
	short, err := durable.New(b.pool, &durable.Config{Schema: schemaOf(b.store), Retention: 50 * time.Second})
	require.NoError(t, err)
	retention := func(key string) time.Duration {
		t.Helper()
		var d time.Duration
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT retention FROM `+b.store.Table()+` WHERE key = $1`, key).Scan(&d))
		return d
	}
	claim := func(s *durable.Store, p idem.ClaimParams) {
		t.Helper()
		_, claimed, err := s.Claim(b.ctx, p)
		require.NoError(t, err)
		require.True(t, claimed)
	}

	// Claimed short, answered long: the longer one.
	p := params(t, "user-1", "answered", "a")
	claim(short, p)
	require.Equal(t, 50*time.Second, retention(p.Key))
	require.NoError(t, long.Complete(b.ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 201}))
	require.Equal(t, time.Hour, retention(p.Key))
	b.age(t, p.Scope, p.Key, "2 minutes")
	rec, err := short.Get(b.ctx, p.Scope, p.Key)
	require.NoError(t, err, "the short Store reads the row's hour")
	require.InDelta(t, float64(58*time.Minute), float64(rec.TTL), float64(time.Minute))

	// Claimed long, answered short: never lowered.
	p = params(t, "user-1", "kept", "a")
	claim(long, p)
	require.NoError(t, short.Complete(b.ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 201}))
	require.Equal(t, time.Hour, retention(p.Key))

	// Claimed short, released long; the next attempt by the short Store
	// keeps the longer one.
	p = params(t, "user-1", "released", "a")
	claim(short, p)
	require.NoError(t, long.Release(b.ctx, p.Scope, p.Key, p.Owner))
	require.Equal(t, time.Hour, retention(p.Key))
	next := params(t, "user-1", "released", "a")
	claim(short, next)
	require.Equal(t, time.Hour, retention(p.Key))

	// Given back by the long Store, with no row: a released row of its own.
	p = params(t, "user-1", "given-back", "a")
	require.NoError(t, long.GiveBack(b.ctx, p))
	require.Equal(t, time.Hour, retention(p.Key))

	// Answered short and expired: the long Store's claim is a new intent
	// under its own retention.
	p = params(t, "user-1", "expired", "a")
	claim(short, p)
	require.NoError(t, short.Complete(b.ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 201}))
	b.age(t, p.Scope, p.Key, "2 minutes")
	_, err = long.Get(b.ctx, p.Scope, p.Key)
	require.ErrorIs(t, err, idem.ErrNotFound, "expired by its own 50s, for the long Store too")
	again := params(t, "user-1", "expired", "b")
	claim(long, again)
	require.Equal(t, time.Hour, retention(p.Key))
}

// TestSweepGoesByEachRowsRetention: a sweeper deletes the rows whose own
// retention has passed and no other, reading past rows that live longer
// (another instance's retention) in one pass, whatever its batch size.
func TestSweepGoesByEachRowsRetention(t *testing.T) {
	b := setup(t, &durable.Config{Retention: time.Hour})
	short, err := durable.New(b.pool, &durable.Config{Schema: schemaOf(b.store), Retention: 50 * time.Second})
	require.NoError(t, err)
	answer := func(s *durable.Store, key string) {
		t.Helper()
		p := params(t, "user-1", key, "a")
		_, claimed, err := s.Claim(b.ctx, p)
		require.NoError(t, err)
		require.True(t, claimed)
		require.NoError(t, s.Complete(b.ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 201}))
		b.age(t, p.Scope, p.Key, "2 minutes")
	}
	// Interleaved by age: long-lived rows before, between and after the
	// expired ones.
	var expired []string
	for i := range 6 {
		answer(b.store, "long-"+string(rune('a'+i)))
		key := "short-" + string(rune('a'+i))
		answer(short, key)
		expired = append(expired, key)
	}
	for _, s := range []*durable.Store{short, b.store} {
		sw, err := durable.NewSweeper(s)
		require.NoError(t, err)
		n, err := durable.TuneSweeper(sw, durable.SweeperTuning{BatchSize: 2, BatchPause: -1}).SweepOnce(b.ctx)
		require.NoError(t, err)
		if s == short {
			require.EqualValues(t, len(expired), n, "every expired row, in one run")
		} else {
			require.Zero(t, n, "the hour's sweeper finds nothing older than its hour")
		}
	}
	require.Equal(t, 6, b.count(t), "the long-lived rows stay")
	for _, key := range expired {
		_, err := b.store.Inspect(b.ctx, "user-1", key)
		require.ErrorIs(t, err, idem.ErrNotFound, key)
	}
}
