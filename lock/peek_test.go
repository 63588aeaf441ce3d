package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/lock"
)

// Peek reads what a lease holds, a holder's or a Set copy, and changes
// nothing: the holder still holds it, with the TTL it had.
func TestPeek(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient, cfg *lock.Config) {
		ctx := context.Background()
		l, err := lock.New(c, cfg)
		require.NoError(t, err)

		_, _, err = l.Peek(ctx, "user-1", "none")
		require.ErrorIs(t, err, lock.ErrNotHeld)

		lease, _, err := l.Obtain(ctx, "user-1", "k1", []byte("running"))
		require.NoError(t, err)
		state, ttl, err := l.Peek(ctx, "user-1", "k1")
		require.NoError(t, err)
		require.Equal(t, []byte("running"), state)
		require.Positive(t, ttl)
		require.LessOrEqual(t, ttl, l.TTL())
		require.NoError(t, lease.Replace(ctx, []byte("still mine"), 0), "Peek must leave the holder's lease alone")

		require.NoError(t, set(l, "user-1", "k2", []byte("a copy"), time.Minute))
		state, ttl, err = l.Peek(ctx, "user-1", "k2")
		require.NoError(t, err)
		require.Equal(t, []byte("a copy"), state)
		require.Greater(t, ttl, l.TTL())
	})
}
