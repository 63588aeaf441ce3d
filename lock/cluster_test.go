package lock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/internal/tempserver"
	"github.com/idemguard/idem/internal/testredis"
	"github.com/idemguard/idem/lock"
)

// The lock on a real Redis Cluster (three masters, three replicas): each
// intent's key is one hash slot, so SET NX and the owner-checked scripts run
// on the master of that slot, on every master alike; and across a failover
// a lease either survives (it reached the replica) or is lost, never
// mistaken for someone else's.
func TestCluster(t *testing.T) {
	cl := tempserver.StartRedisCluster(t)
	c := testredis.Cluster(t, cl.Addrs())
	ctx := context.Background()
	l, err := lock.New(c, nil)
	require.NoError(t, err)

	// intentsOn returns n intents (scope, key) whose lease lives on master.
	intentsOn := func(t *testing.T, master *tempserver.Redis, tag string, n int) [][2]string {
		t.Helper()
		var out [][2]string
		for i := 0; len(out) < n; i++ {
			require.Less(t, i, 100*n, "no key found on %s", master.Addr())
			in := [2]string{"user-" + tag, fmt.Sprint("key-", i)}
			m, err := cl.MasterOf(ctx, l.Key(in[0], in[1]))
			require.NoError(t, err)
			if m == master {
				out = append(out, in)
			}
		}
		return out
	}

	t.Run("obtain replace release on every master", func(t *testing.T) {
		masters, err := cl.Masters(ctx)
		require.NoError(t, err)
		require.Len(t, masters, 3)
		direct := map[*tempserver.Redis]*redis.Client{}
		for _, m := range masters {
			direct[m] = redis.NewClient(&redis.Options{Addr: m.Addr()})
			defer direct[m].Close()
		}
		const n = 120
		leases := make([]*lock.Lease, n)
		perMaster := map[*tempserver.Redis]int{}
		for i := range leases {
			scope, key := "user-every", fmt.Sprint("key-", i)
			lease, _, err := l.Obtain(ctx, scope, key, nil)
			require.NoError(t, err)
			leases[i] = lease
			m, err := cl.MasterOf(ctx, l.Key(scope, key))
			require.NoError(t, err)
			perMaster[m]++
			// The lease is on the master of its slot, with the TTL it was given.
			require.True(t, strings.HasSuffix(direct[m].Get(ctx, l.Key(scope, key)).Val(), "|30000|"))
			_, _, err = l.Obtain(ctx, scope, key, nil)
			require.ErrorIs(t, err, lock.ErrNotObtained)
		}
		require.Len(t, perMaster, 3, "leases on every master: %v", perMaster)
		for m, k := range perMaster {
			require.NotZero(t, k, m.Addr())
		}
		for i, lease := range leases {
			scope, key := "user-every", fmt.Sprint("key-", i)
			ttl, err := c.PTTL(ctx, l.Key(scope, key)).Result()
			require.NoError(t, err)
			require.InDelta(t, (30 * time.Second).Seconds(), ttl.Seconds(), 2)
			require.NoError(t, lease.Replace(ctx, []byte("s"), 5*time.Second))
			ttl, err = c.PTTL(ctx, l.Key(scope, key)).Result()
			require.NoError(t, err)
			require.LessOrEqual(t, ttl, 5*time.Second)
			require.NoError(t, lease.Release(ctx))
			require.ErrorIs(t, lease.Release(ctx), lock.ErrNotHeld)
			require.ErrorIs(t, lease.Replace(ctx, []byte("s"), time.Second), lock.ErrNotHeld)
			again, _, err := l.Obtain(ctx, scope, key, nil)
			require.NoError(t, err)
			// The old lease cannot touch the new holder's.
			require.ErrorIs(t, lease.Release(ctx), lock.ErrNotHeld)
			require.ErrorIs(t, lease.Replace(ctx, []byte("s"), time.Minute), lock.ErrNotHeld)
			require.NoError(t, again.Release(ctx))
		}
	})

	t.Run("race on every master", func(t *testing.T) {
		masters, err := cl.Masters(ctx)
		require.NoError(t, err)
		for _, m := range masters {
			in := intentsOn(t, m, "racer", 1)[0]
			const n = 64
			var won, lost atomic.Int32
			var wg sync.WaitGroup
			start := make(chan struct{})
			for range n {
				wg.Go(func() {
					<-start
					_, _, err := l.Obtain(ctx, in[0], in[1], nil)
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
			require.EqualValues(t, 1, won.Load(), m.Addr())
			require.EqualValues(t, n-1, lost.Load(), m.Addr())
		}
	})

	// Runs last: it kills a master. Leases that reached the replica survive
	// the failover and stay their holders'; leases the master acknowledged
	// after its replica was cut off are lost, and a new holder can take the
	// key (which is why idem claims a durable row under every lease). While
	// the slot has no master, the lock reports ErrUnavailable within its
	// Timeout, never ErrNotObtained.
	t.Run("failover", func(t *testing.T) {
		masters, err := cl.Masters(ctx)
		require.NoError(t, err)
		victim := masters[0]
		replica, err := cl.ReplicaOf(ctx, victim)
		require.NoError(t, err)

		obtainAll := func(ins [][2]string) []*lock.Lease {
			out := make([]*lock.Lease, len(ins))
			for i, in := range ins {
				lease, _, err := l.Obtain(ctx, in[0], in[1], nil)
				require.NoError(t, err)
				out[i] = lease
			}
			return out
		}
		keptIns := intentsOn(t, victim, "kept", 8)
		kept := obtainAll(keptIns)
		direct := redis.NewClient(&redis.Options{Addr: victim.Addr()})
		defer direct.Close()
		require.EqualValues(t, 1, direct.Do(ctx, "WAIT", 1, 2000).Val(), "replicated")
		resume, err := replica.CutReplication(ctx)
		require.NoError(t, err)
		lostIns := intentsOn(t, victim, "lost", 8)
		lost := obtainAll(lostIns)

		down := intentsOn(t, victim, "down", 1)[0]
		probe := intentsOn(t, victim, "probe", 1)[0]

		require.NoError(t, victim.Kill())
		killed := time.Now()
		begin := time.Now()
		_, _, err = l.Obtain(ctx, down[0], down[1], nil)
		require.ErrorIs(t, err, lock.ErrUnavailable)
		require.NotErrorIs(t, err, lock.ErrNotObtained)
		require.Less(t, time.Since(begin), time.Second, "bounded by the lock's Timeout")
		for _, lease := range kept[:2] {
			begin = time.Now()
			require.ErrorIs(t, lease.Release(ctx), lock.ErrUnavailable)
			require.Less(t, time.Since(begin), time.Second)
		}

		require.NoError(t, cl.WaitReady(15*time.Second))
		promoted := time.Since(killed)
		require.NoError(t, resume(ctx))
		var back time.Duration
		require.Eventually(t, func() bool {
			lease, _, err := l.Obtain(ctx, probe[0], probe[1], nil)
			if err != nil {
				return false
			}
			back = time.Since(killed)
			return lease.Release(ctx) == nil
		}, 10*time.Second, 20*time.Millisecond, "leases on the failed slots are granted again")
		t.Logf("replica promoted %v after the kill; leases granted again after %v", promoted.Round(time.Millisecond), back.Round(time.Millisecond))

		for i, lease := range kept {
			m, err := cl.MasterOf(ctx, l.Key(keptIns[i][0], keptIns[i][1]))
			require.NoError(t, err)
			require.Equal(t, replica, m)
			require.NoError(t, lease.Replace(ctx, []byte("kept"), 10*time.Second), "replicated before the kill: still held")
		}
		for i, lease := range lost {
			require.ErrorIs(t, lease.Replace(ctx, []byte("lost"), 0), lock.ErrNotHeld, "acknowledged, never replicated: lost")
			again, _, err := l.Obtain(ctx, lostIns[i][0], lostIns[i][1], nil)
			require.NoError(t, err, "a new holder takes the lost lease's key")
			require.ErrorIs(t, lease.Release(ctx), lock.ErrNotHeld, "and the old holder cannot release it")
			require.NoError(t, again.Release(ctx))
		}
		for _, lease := range kept {
			require.NoError(t, lease.Release(ctx))
		}
	})
}
