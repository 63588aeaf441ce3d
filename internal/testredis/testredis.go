// Package testredis gives tests a real Redis client and an isolated key space.
//
// Tests never flush the server: each one writes under its own random prefix,
// and the keys under it are deleted at cleanup.
package testredis

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Miniredis returns a client of mr configured as the lock wants a client
// (context deadlines honoured, no client-side retries), closed at cleanup.
func Miniredis(tb testing.TB, mr *miniredis.Miniredis) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// DefaultAddr is used when TEST_REDIS_ADDR is unset.
const DefaultAddr = "127.0.0.1:6379"

// Addr returns $TEST_REDIS_ADDR or DefaultAddr.
func Addr() string {
	if a := os.Getenv("TEST_REDIS_ADDR"); a != "" {
		return a
	}
	return DefaultAddr
}

// Client returns a client of the real Redis at Addr, configured as the lock
// wants a client (context deadlines honoured, no client-side retries),
// closed at cleanup. When Redis does not answer, the test fails if CI=true
// and is skipped otherwise, with a hint on how to start it.
func Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		msg := "Redis at %s unreachable (%v); start one with: redis-server --daemonize yes --port 6379 --save ''"
		if os.Getenv("CI") == "true" {
			tb.Fatalf(msg, Addr(), err)
		}
		tb.Skipf(msg, Addr(), err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Prefix returns a fresh key prefix ending in ':' that contains no '{' or '}'.
// Every key under it is deleted at cleanup.
func Prefix(tb testing.TB, c redis.UniversalClient) string {
	tb.Helper()
	p := "idemtest:" + rand.Text()[:12] + ":"
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		iter := c.Scan(ctx, 0, p+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
	})
	return p
}

// Cluster returns a Redis Cluster client of the nodes at addrs, configured
// as the lock wants a client (context deadlines honoured, no retries inside
// a node's client, a dial timeout below the lock's Timeout), closed at
// cleanup. The cluster client itself still follows MOVED and ASK and, up to
// MaxRedirects (3) times within the lock's Timeout, resends a command whose
// node failed; the lock recognises its own lease in the reply to a SET NX
// resent after a lost reply.
//
// It reloads the slot map every second. go-redis learns of a failover only
// when a node answers MOVED or the map is reloaded (by default every 60s): a
// master that died answers nothing, so until a reload every lease of its
// slots is refused as unavailable, even after its replica has taken over.
func Cluster(tb testing.TB, addrs []string) *redis.ClusterClient {
	tb.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                      addrs,
		ContextTimeoutEnabled:      true,
		MaxRetries:                 -1,
		DialTimeout:                250 * time.Millisecond,
		DialerRetries:              1,
		ClusterStateReloadInterval: time.Second,
	})
	tb.Cleanup(func() {
		_ = c.Close()
		waitDialProbes(3 * time.Second)
	})
	return c
}

// waitDialProbes waits up to d until no go-redis dial probe runs. A pool
// whose dials to a node all failed (a killed node) probes it every second in
// a goroutine that notices the pool's Close only when it wakes up; goleak
// would report it.
func waitDialProbes(d time.Duration) {
	buf := make([]byte, 4<<20)
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if n := runtime.Stack(buf, true); !bytes.Contains(buf[:n], []byte("pool.(*ConnPool).tryDial")) {
			return
		}
	}
}
