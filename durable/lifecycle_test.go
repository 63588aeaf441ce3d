package durable_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
)

// TestUnansweredRowNeverExpires: a row in progress, however old, is neither
// taken over by a claim nor swept; once answered, it expires retention after
// its answer, not after its claim.
func TestUnansweredRowNeverExpires(t *testing.T) {
	b := setup(t, &durable.Config{Retention: time.Minute})
	p := params(t, "user-1", "key-1", "a")
	b.claim(t, p)
	b.age(t, p.Scope, p.Key, "1 hour")

	rec, claimed, err := b.store.Claim(b.ctx, params(t, p.Scope, p.Key, "a"))
	require.NoError(t, err)
	require.False(t, claimed, "a row in progress is never taken over")
	require.Equal(t, p.Owner, rec.Owner)
	n, err := b.sweep(t, b.ctx, 0)
	require.NoError(t, err)
	require.Zero(t, n, "a row in progress is never swept")

	// Settled an hour after its claim: the answer lives a full retention.
	require.NoError(t, b.store.Complete(b.ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 201}))
	rec, claimed, err = b.store.Claim(b.ctx, params(t, p.Scope, p.Key, "a"))
	require.NoError(t, err)
	require.False(t, claimed)
	require.Equal(t, 201, rec.Answer.Status, "replayed, not a new intent")
	n, err = b.sweep(t, b.ctx, 0)
	require.NoError(t, err)
	require.Zero(t, n)

	b.age(t, p.Scope, p.Key, "1 hour 2 minutes") // answered 2 minutes ago
	n, err = b.sweep(t, b.ctx, 0)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
}

// TestReleaseKeepsTheIntent: a released row keeps its fingerprint and intent;
// the same request takes it over as the next attempt of the same intent, with
// a new owner; another request under the key is still refused; only expiry
// makes a new intent.
func TestReleaseKeepsTheIntent(t *testing.T) {
	b := setup(t, nil)
	p := params(t, "user-1", "key-1", "a")
	p.Intent = token(t)
	first := b.claim(t, p)
	require.Equal(t, p.Intent, first.Intent)
	require.Equal(t, 1, first.Attempt)
	require.NoError(t, b.store.Release(b.ctx, p.Scope, p.Key, p.Owner))
	require.ErrorIs(t, b.store.Release(b.ctx, p.Scope, p.Key, p.Owner), idem.ErrNotFound, "released once")

	other := params(t, p.Scope, p.Key, "b")
	rec, claimed, err := b.store.Claim(b.ctx, other)
	require.NoError(t, err)
	require.False(t, claimed, "another request under a released key is refused")
	require.NotEqual(t, other.Fingerprint, rec.Fingerprint)

	retry := params(t, p.Scope, p.Key, "a")
	retry.Intent = token(t)
	second := b.claim(t, retry)
	require.Equal(t, p.Intent, second.Intent, "same intent")
	require.Equal(t, 2, second.Attempt)
	require.Equal(t, retry.Owner, second.Owner, "new owner")
	require.True(t, second.InProgress())
	require.ErrorIs(t, b.store.Complete(b.ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 201}), idem.ErrNotOwner,
		"the released attempt's owner no longer completes")
	require.NoError(t, b.store.Complete(b.ctx, p.Scope, p.Key, retry.Owner, idem.Response{Status: 201}))

	// Expired: the next claim is a new intent, whatever its request.
	b.age(t, p.Scope, p.Key, "25 hours")
	next := params(t, p.Scope, p.Key, "b")
	next.Intent = token(t)
	third := b.claim(t, next)
	require.Equal(t, next.Intent, third.Intent)
	require.Equal(t, 1, third.Attempt)
}

// TestClaimRecordsTheHold: the row carries its owner's deadline, the
// database's now() plus ClaimParams.Hold.
func TestClaimRecordsTheHold(t *testing.T) {
	b := setup(t, nil)
	p := params(t, "user-1", "key-1", "a")
	p.Hold = 10 * time.Minute
	rec := b.claim(t, p)
	require.Equal(t, rec.CreatedAt.Add(10*time.Minute), rec.HoldUntil)
}

// TestClaimDoesNotWaitForARowLock: a caller's transaction that completed a
// key's answer and has not committed holds the row's lock; a claim of the
// key does not wait for it, and sees the key in progress, whether the Store
// reads or inserts first.
func TestClaimDoesNotWaitForARowLock(t *testing.T) {
	for _, insertFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("insert-first=%v", insertFirst), func(t *testing.T) {
			b := setup(t, nil)
			durable.PinInsertFirst(b.store, insertFirst)
			p := params(t, "user-1", "key-1", "a")
			b.claim(t, p)
			tx, err := b.pool.Begin(b.ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(context.WithoutCancel(b.ctx)) }()
			require.NoError(t, b.store.WithDB(tx).Complete(b.ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 201}))

			ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second)
			defer cancel()
			for _, body := range []string{"a", "b"} { // a retry, and a reused key
				rec, claimed, err := b.store.Claim(ctx, params(t, p.Scope, p.Key, body))
				require.NoError(t, err, "the claim waited for the transaction")
				require.False(t, claimed)
				require.True(t, rec.InProgress())
			}
			require.NoError(t, tx.Commit(b.ctx))
			rec, _, err := b.store.Claim(b.ctx, params(t, p.Scope, p.Key, "a"))
			require.NoError(t, err)
			require.Equal(t, 201, rec.Answer.Status)
		})
	}
}
