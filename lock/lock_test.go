package lock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/internal/testredis"
	"github.com/idemguard/idem/lock"
)

// backend is a Redis the tests run against: the real server and miniredis
// must behave the same for everything the Locker does.
type backend struct {
	name  string
	setup func(t *testing.T) (redis.UniversalClient, *lock.Config)
}

var backends = []backend{
	{"redis", func(t *testing.T) (redis.UniversalClient, *lock.Config) {
		c := testredis.Client(t)
		return c, &lock.Config{Prefix: testredis.Prefix(t, c)}
	}},
	{"miniredis", func(t *testing.T) (redis.UniversalClient, *lock.Config) {
		return testredis.Miniredis(t, miniredis.RunT(t)), nil
	}},
}

func forEachBackend(t *testing.T, fn func(t *testing.T, c redis.UniversalClient, cfg *lock.Config)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			c, cfg := b.setup(t)
			fn(t, c, cfg)
		})
	}
}

func TestObtainRelease(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient, cfg *lock.Config) {
		ctx := context.Background()
		l, err := lock.New(c, cfg)
		require.NoError(t, err)

		lease, _, err := l.Obtain(ctx, "user-1", "k1", nil)
		require.NoError(t, err)

		// The value is a random owner token, then the TTL it was given;
		// the key lives for the configured TTL.
		val, err := c.Get(ctx, l.Key("user-1", "k1")).Result()
		require.NoError(t, err)
		token, ok := strings.CutSuffix(val, "|30000|")
		require.True(t, ok, "the token, then the TTL it was given: %q", val)
		require.GreaterOrEqual(t, len(token), 16)
		ttl, err := c.PTTL(ctx, l.Key("user-1", "k1")).Result()
		require.NoError(t, err)
		require.InDelta(t, (30 * time.Second).Seconds(), ttl.Seconds(), 1)

		_, _, err = l.Obtain(ctx, "user-1", "k1", nil)
		require.ErrorIs(t, err, lock.ErrNotObtained)

		// Same key, another scope: a different intent, another token.
		other, _, err := l.Obtain(ctx, "user-2", "k1", nil)
		require.NoError(t, err)
		require.NotEqual(t, val, c.Get(ctx, l.Key("user-2", "k1")).Val())

		require.NoError(t, lease.Release(ctx))
		require.ErrorIs(t, lease.Release(ctx), lock.ErrNotHeld)
		require.ErrorIs(t, lease.Replace(ctx, []byte("late"), time.Minute), lock.ErrNotHeld)
		require.Zero(t, c.Exists(ctx, l.Key("user-1", "k1")).Val(), "nothing written back")

		again, _, err := l.Obtain(ctx, "user-1", "k1", nil)
		require.NoError(t, err)
		require.NoError(t, again.Release(ctx))
		require.NoError(t, other.Release(ctx))
	})
}

// Exactly one of 64 racing callers obtains the lease.
func TestObtainRace(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient, cfg *lock.Config) {
		// 64 new connections at once: on a busy machine their dials take
		// longer than the default timeout, which this test is not about.
		var c2 lock.Config
		if cfg != nil {
			c2 = *cfg
		}
		c2.Timeout = 10 * time.Second
		l, err := lock.New(c, &c2)
		require.NoError(t, err)
		const n = 64
		var won, lost atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range n {
			wg.Go(func() {
				<-start
				_, _, err := l.Obtain(context.Background(), "racer", "one-key", nil)
				switch {
				case err == nil:
					won.Add(1)
				case errors.Is(err, lock.ErrNotObtained):
					lost.Add(1)
				default:
					t.Errorf("unexpected error: %v", err)
				}
			})
		}
		close(start)
		wg.Wait()
		require.EqualValues(t, 1, won.Load())
		require.EqualValues(t, n-1, lost.Load())
	})
}

// A lease that expired can neither release nor replace the key a new holder
// took.
func TestExpiredLeaseCannotTouchNewHolder(t *testing.T) {
	mr := miniredis.RunT(t)
	ctx := context.Background()
	l, err := lock.New(testredis.Miniredis(t, mr), &lock.Config{TTL: 10 * time.Second})
	require.NoError(t, err)

	first, _, err := l.Obtain(ctx, "u", "k", []byte("first"))
	require.NoError(t, err)
	mr.FastForward(11 * time.Second)
	require.False(t, mr.Exists(l.Key("u", "k")), "expired")

	second, _, err := l.Obtain(ctx, "u", "k", []byte("second"))
	require.NoError(t, err)
	held := mustGet(t, mr, l.Key("u", "k"))
	require.ErrorIs(t, first.Release(ctx), lock.ErrNotHeld)
	require.ErrorIs(t, first.Replace(ctx, []byte("first again"), time.Minute), lock.ErrNotHeld)
	require.Equal(t, held, mustGet(t, mr, l.Key("u", "k")), "the new holder's value, untouched")
	require.True(t, strings.HasSuffix(held, "|10000|second"))
	require.NoError(t, second.Release(ctx))
}

func mustGet(t *testing.T, mr *miniredis.Miniredis, key string) string {
	t.Helper()
	v, err := mr.Get(key)
	require.NoError(t, err)
	return v
}

func TestUnavailable(t *testing.T) {
	ctx := context.Background()
	t.Run("error reply", func(t *testing.T) {
		mr := miniredis.RunT(t)
		l, err := lock.New(testredis.Miniredis(t, mr), nil)
		require.NoError(t, err)
		lease, _, err := l.Obtain(ctx, "u", "k", nil)
		require.NoError(t, err)

		mr.SetError("LOADING Redis is loading the dataset in memory")
		_, _, err = l.Obtain(ctx, "u", "k2", nil)
		require.ErrorIs(t, err, lock.ErrUnavailable)
		require.NotErrorIs(t, err, lock.ErrNotObtained)
		require.ErrorIs(t, lease.Release(ctx), lock.ErrUnavailable)

		mr.SetError("")
		require.NoError(t, lease.Release(ctx))
	})
	t.Run("server gone", func(t *testing.T) {
		mr := miniredis.RunT(t)
		l, err := lock.New(testredis.Miniredis(t, mr), &lock.Config{Timeout: 200 * time.Millisecond})
		require.NoError(t, err)
		mr.Close()
		_, _, err = l.Obtain(ctx, "u", "k", nil)
		require.ErrorIs(t, err, lock.ErrUnavailable)
	})
	t.Run("caller cancelled", func(t *testing.T) {
		mr := miniredis.RunT(t)
		l, err := lock.New(testredis.Miniredis(t, mr), nil)
		require.NoError(t, err)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, _, err = l.Obtain(cctx, "u", "k", nil)
		require.ErrorIs(t, err, context.Canceled)
		require.NotErrorIs(t, err, lock.ErrUnavailable, "the caller gave up; Redis was not at fault")
	})
}

// Keys that a naive concatenation would merge stay distinct, and every key
// has exactly one hash tag, so one intent maps to one Cluster slot.
func TestKeyDerivation(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:0", ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	l, err := lock.New(c, nil)
	require.NoError(t, err)
	pairs := [][2]string{
		{"a", "bc"}, {"ab", "c"}, {"a:b", "c"}, {"a", "b:c"}, {"", "abc"}, {"abc", ""},
		{"u{1}", "k"}, {"u", "{1}k"}, {"user-1", "key}"}, {"user-1}", "key"},
		{"a\x00", "b"}, {"a", "\x00b"},
	}
	seen := map[string][2]string{}
	for _, p := range pairs {
		k := l.Key(p[0], p[1])
		prev, dup := seen[k]
		require.Falsef(t, dup, "%q and %q share Redis key %q", p, prev, k)
		seen[k] = p
		require.True(t, strings.HasPrefix(k, "idem:{"), k)
		require.Equal(t, 1, strings.Count(k, "{"), k)
		require.Equal(t, 1, strings.Count(k, "}"), k)
		require.True(t, strings.HasSuffix(k, "}"), k)
		require.Equal(t, k, l.Key(p[0], p[1]), "derivation must be stable")
	}
}

func TestConfigValidation(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:0", ContextTimeoutEnabled: true, MaxRetries: -1})
	defer c.Close()
	for _, tc := range []struct {
		name  string
		cfg   lock.Config
		field string
	}{
		{"brace in prefix", lock.Config{Prefix: "idem:{x}"}, "Config.Prefix"},
		{"sub-second ttl", lock.Config{TTL: 500 * time.Millisecond}, "Config.TTL"},
		{"fractional ttl", lock.Config{TTL: 1500 * time.Millisecond}, "Config.TTL"},
		{"negative timeout", lock.Config{Timeout: -time.Second}, "Config.Timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := lock.New(c, &tc.cfg)
			require.ErrorContains(t, err, tc.field)
		})
	}
	_, err := lock.New(nil, nil)
	require.Error(t, err)
	l, err := lock.New(c, nil)
	require.NoError(t, err)
	require.Equal(t, 30*time.Second, l.TTL())
}

// The state written with a lease is what a refused caller reads back, in the
// same round trip; only the holder can replace or delete it, and Set and
// Delete act whoever holds the key.
func TestLeaseState(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c redis.UniversalClient, cfg *lock.Config) {
		ctx := context.Background()
		l, err := lock.New(c, cfg)
		require.NoError(t, err)
		running := []byte("running\x00\xff binary-safe")

		lease, held, err := l.Obtain(ctx, "u", "k", running)
		require.NoError(t, err)
		require.Nil(t, held)

		other, held, err := l.Obtain(ctx, "u", "k", []byte("other"))
		require.ErrorIs(t, err, lock.ErrNotObtained)
		require.Nil(t, other)
		require.Equal(t, running, held, "a refused caller reads the holder's state")

		// The holder replaces the state; the lease keeps its token.
		require.NoError(t, lease.Replace(ctx, []byte("answer"), 5*time.Second))
		_, held, err = l.Obtain(ctx, "u", "k", nil)
		require.ErrorIs(t, err, lock.ErrNotObtained)
		require.Equal(t, []byte("answer"), held)
		ttl, err := c.PTTL(ctx, l.Key("u", "k")).Result()
		require.NoError(t, err)
		require.LessOrEqual(t, ttl, 5*time.Second)
		require.Greater(t, ttl, 3*time.Second)

		// Set overwrites whoever holds the key; the old holder can then
		// neither replace nor release it.
		require.NoError(t, set(l, "u", "k", []byte("copy"), time.Minute))
		require.ErrorIs(t, lease.Replace(ctx, []byte("stale"), time.Minute), lock.ErrNotHeld)
		require.ErrorIs(t, lease.Release(ctx), lock.ErrNotHeld)
		_, held, err = l.Obtain(ctx, "u", "k", nil)
		require.ErrorIs(t, err, lock.ErrNotObtained)
		require.Equal(t, []byte("copy"), held)

		// Delete frees the key for the next Obtain.
		require.NoError(t, l.Delete(ctx, "u", "k"))
		require.NoError(t, l.Delete(ctx, "u", "k"), "deleting a free key is not an error")
		again, held, err := l.Obtain(ctx, "u", "k", nil)
		require.NoError(t, err)
		require.Nil(t, held)

		// TryLock's function replaces while held and deletes on nil.
		require.NoError(t, again.Release(ctx))
		held, _, replace, err := l.TryLock(ctx, "u", "k", []byte("a"))
		require.NoError(t, err)
		require.Nil(t, held)
		require.NotNil(t, replace)
		held, age, refused, err := l.TryLock(ctx, "u", "k", []byte("b"))
		require.NoError(t, err)
		require.Nil(t, refused)
		require.Equal(t, []byte("a"), held)
		require.GreaterOrEqual(t, age, time.Duration(0))
		require.Less(t, age, 5*time.Second, "the lease was just taken")
		require.NoError(t, replace(ctx, []byte("c"), time.Minute))
		held, _, _, err = l.TryLock(ctx, "u", "k", nil)
		require.NoError(t, err)
		require.Equal(t, []byte("c"), held)
		require.NoError(t, replace(ctx, []byte("d"), 0), "0 keeps the remaining life")
		left, err := c.PTTL(ctx, l.Key("u", "k")).Result()
		require.NoError(t, err)
		require.Greater(t, left, 50*time.Second)
		require.LessOrEqual(t, left, time.Minute)
		require.NoError(t, replace(ctx, nil, 0))
		held, _, replace2, err := l.TryLock(ctx, "u", "k", nil)
		require.NoError(t, err)
		require.Nil(t, held)
		require.NotNil(t, replace2, "a released key is free")
		require.NoError(t, replace2(ctx, []byte("new holder"), time.Minute))
		require.NoError(t, replace(ctx, []byte("late"), time.Minute), "a lease no longer held is left alone")
		held, _, _, err = l.TryLock(ctx, "u", "k", nil)
		require.NoError(t, err)
		require.Equal(t, []byte("new holder"), held)

		require.Error(t, set(l, "u", "k", nil, 0), "a TTL below 1ms is refused")
	})
}

// set is Locker.Set, waiting for its answer.
func set(l *lock.Locker, scope, key string, state []byte, ttl time.Duration) error {
	answered := make(chan error, 1)
	l.Set(scope, key, state, ttl, func(err error) { answered <- err })
	return <-answered
}

// A refused caller learns how long ago the held lease was taken, by Redis's
// own clock.
func TestHeldLeaseAge(t *testing.T) {
	mr := miniredis.RunT(t)
	l, err := lock.New(testredis.Miniredis(t, mr), nil)
	require.NoError(t, err)
	ctx := context.Background()
	_, _, err = l.Obtain(ctx, "u", "k", []byte("s"))
	require.NoError(t, err)
	mr.FastForward(12 * time.Second)
	held, age, replace, err := l.TryLock(ctx, "u", "k", nil)
	require.NoError(t, err)
	require.Nil(t, replace)
	require.Equal(t, []byte("s"), held)
	require.Equal(t, 12*time.Second, age)

	// A value Set for longer than a lease's TTL is as old as its write,
	// measured against the TTL it was given.
	require.NoError(t, set(l, "u", "k", []byte("copy"), time.Hour))
	_, age, _, err = l.TryLock(ctx, "u", "k", nil)
	require.NoError(t, err)
	require.GreaterOrEqual(t, age, time.Duration(0))
	require.Less(t, age, time.Second)
}

// A held lease's age is measured against the TTL its writer gave it, which
// the value records, so Lockers with different TTLs agree; an age that
// cannot be told (a remaining TTL above the recorded one, as after Redis's
// clock stepped back, or a value of an older version that records no TTL) is
// negative.
func TestHeldLeaseAgeAcrossTTLs(t *testing.T) {
	mr := miniredis.RunT(t)
	c := testredis.Miniredis(t, mr)
	writer, err := lock.New(c, &lock.Config{TTL: 300 * time.Second})
	require.NoError(t, err)
	reader, err := lock.New(c, &lock.Config{TTL: 30 * time.Second})
	require.NoError(t, err)
	ctx := context.Background()
	lease, _, err := writer.Obtain(ctx, "u", "k", []byte("s"))
	require.NoError(t, err)
	mr.FastForward(6 * time.Second)
	held, age, _, err := reader.TryLock(ctx, "u", "k", nil)
	require.NoError(t, err)
	require.Equal(t, []byte("s"), held)
	require.Equal(t, 6*time.Second, age, "the writer's 300 s less its remaining 294 s")

	// Replace keeping the TTL keeps what the age is measured against;
	// Replace with a TTL records the new one.
	require.NoError(t, lease.Replace(ctx, []byte("t"), 0))
	held, age, _, err = reader.TryLock(ctx, "u", "k", nil)
	require.NoError(t, err)
	require.Equal(t, []byte("t"), held)
	require.Equal(t, 6*time.Second, age)
	require.NoError(t, lease.Replace(ctx, []byte("t"), 20*time.Second))
	mr.FastForward(time.Second)
	_, age, _, err = reader.TryLock(ctx, "u", "k", nil)
	require.NoError(t, err)
	require.Equal(t, time.Second, age)

	// Redis's clock stepped back 10 minutes: the key lives longer than it
	// was given.
	k := reader.Key("u", "k")
	mr.SetTTL(k, 20*time.Second+10*time.Minute)
	_, age, _, err = reader.TryLock(ctx, "u", "k", nil)
	require.NoError(t, err)
	require.Negative(t, age)

	// A value of an older version: the token, then the state.
	token, _, _ := strings.Cut(mustGet(t, mr, k), "|")
	require.NoError(t, mr.Set(k, token+"s"))
	mr.SetTTL(k, 30*time.Second)
	held, age, _, err = reader.TryLock(ctx, "u", "k", nil)
	require.NoError(t, err)
	require.Equal(t, []byte("s"), held)
	require.Negative(t, age)
}

// resend is a go-redis hook that sends every command and pipeline twice and
// keeps the second replies, as a client does that resends what it sent when
// the reply was lost. A ClusterClient does so up to MaxRedirects times, which
// it also spends on following MOVED and ASK.
type resend struct{}

func (resend) DialHook(next redis.DialHook) redis.DialHook { return next }

func (resend) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		_ = next(ctx, cmd)
		return next(ctx, cmd)
	}
}

func (resend) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		_ = next(ctx, cmds)
		return next(ctx, cmds)
	}
}

// A SET NX resent after its reply was lost finds the lease its first send
// took: Obtain knows its own token and reports the lease obtained, not held
// by another. A resent release finds nothing to release and says so, which
// is why New refuses a client that resends on its own (MaxRetries).
func TestObtainResent(t *testing.T) {
	mr := miniredis.RunT(t)
	c := testredis.Miniredis(t, mr)
	c.AddHook(resend{})
	l, err := lock.New(c, nil)
	require.NoError(t, err)
	ctx := context.Background()

	lease, held, err := l.Obtain(ctx, "u", "k", []byte("mine"))
	require.NoError(t, err, "the caller's own lease")
	require.Nil(t, held)
	_, held, err = l.Obtain(ctx, "u", "k", nil)
	require.ErrorIs(t, err, lock.ErrNotObtained, "another caller's")
	require.Equal(t, []byte("mine"), held)

	require.NoError(t, lease.Replace(ctx, []byte("still mine"), 0))
	require.ErrorIs(t, lease.Release(ctx), lock.ErrNotHeld, "released by the first send, reported by the second")
	require.False(t, mr.Exists(l.Key("u", "k")))
}

// New refuses a client that ignores context deadlines or resends commands,
// naming the option and its value, for every client type whose options it
// can read; a ClusterClient resends nothing by default.
func TestClientOptions(t *testing.T) {
	const addr = "127.0.0.1:1"
	for _, tc := range []struct {
		name   string
		client func() redis.UniversalClient
		err    string // "" when accepted
	}{
		{"client", func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
		}, ""},
		{"client ignoring deadlines", func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		}, "lock: the redis client must set ContextTimeoutEnabled: true, or go-redis ignores the deadline that enforces Config.Timeout"},
		{"client with default retries", func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		}, "lock: the redis client must set MaxRetries: -1, not retry 3 times (0 means go-redis's default of 3)"},
		{"client with 1 retry", func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: 1})
		}, "MaxRetries: -1, not retry 1 times"},
		{"failover client with default retries", func() redis.UniversalClient {
			return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{addr}, ContextTimeoutEnabled: true})
		}, "MaxRetries: -1, not retry 3 times"},
		{"cluster client", func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, ContextTimeoutEnabled: true})
		}, ""},
		{"cluster client ignoring deadlines", func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}})
		}, "ContextTimeoutEnabled: true"},
		{"cluster client with retries", func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, ContextTimeoutEnabled: true, MaxRetries: 2})
		}, "MaxRetries: -1, not retry 2 times"},
		{"ring", func() redis.UniversalClient {
			return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}, ContextTimeoutEnabled: true, MaxRetries: -1})
		}, ""},
		{"ring with default retries", func() redis.UniversalClient {
			return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}, ContextTimeoutEnabled: true})
		}, "MaxRetries: -1, not retry 3 times"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client()
			defer c.Close()
			_, err := lock.New(c, nil)
			if tc.err == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.err)
		})
	}
}
