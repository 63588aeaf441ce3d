package durable_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/rare"
)

// A Store reads first until a window of its claims has rarely found a row,
// then inserts first, and reads first again once duplicates come back: the
// mode follows what its claims find, whatever they find it with.
func TestStoreInsertsFirstWhileKeysAreNew(t *testing.T) {
	b := setup(t, nil)
	require.False(t, durable.InsertsFirst(b.store), "a new Store reads first")
	for i := range rare.Size {
		b.claim(t, params(t, "u", fmt.Sprintf("new-%d", i), "pay"))
	}
	require.True(t, durable.InsertsFirst(b.store), "a window of new keys")

	// Retries of a key in progress, each finding the row.
	retry := params(t, "u", "retried", "pay")
	b.claim(t, retry)
	for i := range rare.Leave {
		require.True(t, durable.InsertsFirst(b.store), "duplicate %d of %d", i, rare.Leave)
		rec, claimed, err := b.store.Claim(b.ctx, params(t, "u", "retried", "pay"))
		require.NoError(t, err)
		require.False(t, claimed)
		require.Equal(t, retry.Owner, rec.Owner)
	}
	require.False(t, durable.InsertsFirst(b.store), "duplicates came back")
}
