package idem_test

import (
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/lock"
)

// TestKeyHash: KeyHash is the module's one hash of (scope, key): stable,
// length-prefixed, and what the lease's Redis key holds (durable's
// notifications are checked in durable, TestKeyTagIsKeyHash).
func TestKeyHash(t *testing.T) {
	h := idem.KeyHash("user-1", "key-1")
	require.Len(t, h, 43)
	require.Equal(t, h, idem.KeyHash("user-1", "key-1"))
	require.NotEqual(t, h, idem.KeyHash("user-1k", "ey-1"), "length-prefixed")

	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	l, err := lock.New(rdb, &lock.Config{Prefix: "p:"})
	require.NoError(t, err)
	require.Equal(t, "p:{"+h+"}", l.Key("user-1", "key-1"))
}
