package idem_test

// The guard on a real Redis Cluster (internal/tempserver: three masters,
// three replicas): its behaviour with leases on every master, and a master
// failover under load, where the leases the dead master had not yet
// replicated are lost.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/internal/tempserver"
	"github.com/idemguard/idem/internal/testdb"
	"github.com/idemguard/idem/internal/testredis"
	"github.com/idemguard/idem/lock"
)

// clusterIntent returns a fresh (scope, key) whose lease lives on master.
func clusterIntent(t *testing.T, cl *tempserver.RedisCluster, l *lock.Locker, master *tempserver.Redis, scope string) string {
	t.Helper()
	for range 200 {
		key := newKey()
		m, err := cl.MasterOf(t.Context(), l.Key(scope, key))
		require.NoError(t, err)
		if m == master {
			return key
		}
	}
	t.Fatalf("no key found on %s", master.Addr())
	return ""
}

// The hybrid strategy with its lease on a Redis Cluster, against the real
// PostgreSQL: exactly one execution per intent whichever master holds the
// lease, and replay, 422 and 409 as on a single Redis. A request whose
// lease call times out (a busy machine) falls back to the table claim,
// which keeps every guarantee, so the fallbacks are logged, not asserted;
// the lease must be on the cluster whenever a request reached it.
func TestClusterGuard(t *testing.T) {
	cl := tempserver.StartRedisCluster(t)
	c := testredis.Cluster(t, cl.Addrs())
	ctx := context.Background()
	// A cold client first loads the slot map and dials each master; under
	// -race on two cores that can outlast the lock's 500ms Timeout, and the
	// test wants every lease taken, not fallbacks.
	require.NoError(t, c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return m.Ping(ctx).Err() }))
	newGuard := func(t *testing.T) (*idem.Guard, *lock.Locker) {
		store, _ := testdb.Store(t, nil)
		l, err := lock.New(c, nil)
		require.NoError(t, err)
		g, err := idem.New(store, &idem.Config{Lock: l, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		return g, l
	}

	t.Run("exactly once on every master", func(t *testing.T) {
		g, l := newGuard(t)
		masters, err := cl.Masters(ctx)
		require.NoError(t, err)
		require.Len(t, masters, 3)
		for _, m := range masters {
			r := req("racer", clusterIntent(t, cl, l, m, "racer"), `{"hold_ids":[88211]}`)
			before := g.Stats().Fallbacks
			raceOneKey(t, g, r, m.Addr())
			fellBack := g.Stats().Fallbacks - before
			t.Logf("%s: %d of %d requests fell back to the table claim", m.Addr(), fellBack, raceRequests)
			if fellBack == raceRequests {
				continue // no request reached the lease: nothing to look for
			}
			exists, err := c.Exists(ctx, l.Key(r.Scope, r.Key)).Result()
			require.NoError(t, err)
			require.EqualValues(t, 1, exists, "the lease is on the cluster: %+v", g.Stats())
		}
	})

	t.Run("replay 422 409 over HTTP", func(t *testing.T) {
		g, l := newGuard(t)
		gate := make(chan struct{})
		var calls atomic.Int32
		srv := httptest.NewServer(g.Middleware(bearerScope, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := calls.Add(1)
			_, _ = io.ReadAll(r.Body)
			<-gate
			w.Header().Set("Location", fmt.Sprint("/orders/", n))
			w.WriteHeader(http.StatusCreated)
			_, _ = fmt.Fprintf(w, `{"order":%d}`, n)
		})))
		t.Cleanup(srv.Close)
		post := func(key, body string) (int, string, string) {
			hr, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
			require.NoError(t, err)
			hr.Header.Set("Authorization", "Bearer alice")
			hr.Header.Set(idem.HeaderKey, key)
			resp, err := srv.Client().Do(hr)
			require.NoError(t, err)
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			return resp.StatusCode, resp.Header.Get("Location"), string(b)
		}
		masters, err := cl.Masters(ctx)
		require.NoError(t, err)
		for _, m := range masters {
			key := clusterIntent(t, cl, l, m, "alice")
			first := make(chan [3]string, 1)
			before := calls.Load()
			go func() {
				s, loc, body := post(key, `{"hold_ids":[1]}`)
				first <- [3]string{fmt.Sprint(s), loc, body}
			}()
			require.Eventually(t, func() bool { return calls.Load() == before+1 }, 5*time.Second, 5*time.Millisecond)

			s, _, _ := post(key, `{"hold_ids":[1]}`)
			require.Equal(t, http.StatusConflict, s, "in progress on %s", m.Addr())
			s, _, _ = post(key, `{"hold_ids":[2]}`)
			require.Equal(t, http.StatusUnprocessableEntity, s, "key reused on %s", m.Addr())

			gate <- struct{}{}
			got := <-first
			require.Equal(t, "201", got[0])
			for range 2 {
				s, loc, body := post(key, `{"hold_ids":[1]}`)
				require.Equal(t, http.StatusCreated, s)
				require.Equal(t, got[1], loc)
				require.Equal(t, got[2], body, "replayed")
			}
			require.Equal(t, before+1, calls.Load(), "ran once")
		}
		close(gate)
		t.Logf("%d requests fell back to the table claim", g.Stats().Fallbacks)
	})
}

// leaseSpy is a go-redis hook that records the leases the guard's lock is
// granted, per Redis key, in order, whether a lock command went alone or in
// one of the Locker's pipelines: a SET ... NX GET that answered nil, which it
// does exactly when it took the key.
type leaseSpy struct {
	mu      sync.Mutex
	granted map[string][]time.Time
}

func (s *leaseSpy) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *leaseSpy) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		s.record(cmd)
		return err
	}
}

func (s *leaseSpy) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			s.record(cmd)
		}
		return err
	}
}

// record notes cmd if it is the lock's obtain that took its key: SET <key>
// <value> ... NX ... GET, answered nil.
func (s *leaseSpy) record(cmd redis.Cmder) {
	if set, nx, get := setOptions(cmd); !set || !nx || !get || !errors.Is(cmd.Err(), redis.Nil) {
		return
	}
	key, _ := cmd.Args()[1].(string)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.granted == nil {
		s.granted = map[string][]time.Time{}
	}
	s.granted[key] = append(s.granted[key], time.Now())
}

func (s *leaseSpy) grants(key string) []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.granted[key]...)
}

// nodeKeys returns the keys under prefix that one node holds.
func nodeKeys(t *testing.T, n *tempserver.Redis, prefix string) map[string]bool {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: n.Addr()})
	defer c.Close()
	out := map[string]bool{}
	iter := c.Scan(t.Context(), 0, prefix+"*", 1000).Iterator()
	for iter.Next(t.Context()) {
		out[iter.Val()] = true
	}
	require.NoError(t, iter.Err())
	return out
}

// A Redis Cluster master fails under load. The replica of the master that
// holds the leases of intents in flight is cut off from it (its replication
// link is down for 300ms: asynchronous replication's window, widened), four
// more intents on that master start meanwhile, then the master is killed
// (SIGKILL) and its replica takes over without their leases. Their work is
// held until leases are granted again, so that their retries get through
// the filter (a new lease on the new master) while it runs: the durable row
// refuses them (409), and every intent runs once.
//
// It runs with a fleet of hybrid instances, and with a mixed fleet (one
// hybrid, one table instance: the table strategy alone has no Redis to
// lose). Besides the RELIABILITY line it logs a FAILOVER line: how long the
// replica took to be promoted, how long until the lock was granted leases on
// the failed slots again (go-redis must first reload its slot map, every
// second here), how many leases were lost, how many of them belonged to work
// in flight, and how many retries took a new lease while that work ran.
// recovered_in is the time from the kill until the first fresh intent whose
// lease lives on the dead master was answered.
func TestFaultRedisClusterFailover(t *testing.T) {
	for _, strategy := range []string{"hybrid", "mixed"} {
		t.Run("strategy="+strategy, func(t *testing.T) {
			const prefix = "idem:"
			cl := tempserver.StartRedisCluster(t)
			c := testredis.Cluster(t, cl.Addrs())
			spy := &leaseSpy{}
			c.AddHook(spy)
			pool, dbcfg := sharedPG(t)
			const leaseTTL = 10 * time.Second // far longer than the failover: a lease taken again was lost, not expired
			r := newRig(t, rigOpts{strategy: "hybrid", pool: pool, dbcfg: dbcfg, redis: c, prefix: prefix,
				leaseTTL: leaseTTL, workTO: 8 * time.Second, peerTable: strategy == "mixed"})
			keys, err := lock.New(c, &lock.Config{Prefix: prefix, TTL: leaseTTL})
			require.NoError(t, err)
			ctx := context.Background()

			var (
				injected    sync.Map // *intent -> true: its work is held until a retry took a new lease
				injWG       sync.WaitGroup
				extra       []*intent // intents created by the fault, for finish
				victim      *tempserver.Redis
				killed      time.Time
				lost        map[string]bool
				recoveredIn time.Duration
				promotedIn  time.Duration
				backIn      time.Duration
				monitor     sync.WaitGroup
				leasesBack  = make(chan struct{})
			)
			r.onWork = func(ctx context.Context, in *intent, n int) {
				if _, ok := injected.Load(in); !ok || n != 0 {
					return
				}
				select { // the work runs on while its retries find a new master
				case <-ctx.Done():
				case <-leasesBack:
				}
				// ... and until one of them took a new lease (its claim is
				// refused: this execution holds the row), for at most 3s.
				k := keys.Key(in.scope, in.key)
				for deadline := time.Now().Add(3 * time.Second); len(spy.grants(k)) < 2 && time.Now().Before(deadline); {
					select {
					case <-ctx.Done():
						return
					case <-time.After(10 * time.Millisecond):
					}
				}
			}
			intentsOn := func(m *tempserver.Redis, n, base int) []*intent {
				var out []*intent
				for i := 0; len(out) < n; i++ {
					require.Less(t, i, 100*n)
					in := r.newIntent(base + i)
					owner, err := cl.MasterOf(ctx, keys.Key(in.scope, in.key))
					require.NoError(t, err)
					if owner == m {
						out = append(out, in)
					}
				}
				return out
			}
			all, _ := r.load(8, 4*time.Second, markSlow, func() {
				time.Sleep(600 * time.Millisecond)
				victim = masterOfInFlight(t, r, cl, keys)
				replica, err := cl.ReplicaOf(ctx, victim)
				require.NoError(t, err)
				resume, err := replica.CutReplication(ctx)
				require.NoError(t, err)
				for _, in := range intentsOn(victim, 4, 3_000_000) {
					injected.Store(in, true)
					r.register(in)
					extra = append(extra, in)
					// Through guard.Do: an HTTP client would give up on the
					// held work after its 5s timeout.
					deadline := time.Now().Add(10 * time.Second)
					for range 2 {
						injWG.Go(func() { r.drive(ctx, in, false, deadline) })
					}
				}
				probes := intentsOn(victim, 10, 4_000_000)
				probeLease := intentsOn(victim, 1, 5_000_000)[0] // the monitor's, never sent
				// Leases taken on the master now never reach the replica.
				time.Sleep(300 * time.Millisecond)
				onVictim, onReplica := nodeKeys(t, victim, prefix), nodeKeys(t, replica, prefix)
				require.NoError(t, victim.Kill())
				killed = time.Now()
				lost = map[string]bool{}
				for k := range onVictim {
					if !onReplica[k] {
						lost[k] = true
					}
				}
				monitor.Go(func() {
					defer close(leasesBack)
					if err := cl.WaitReady(20 * time.Second); err != nil {
						t.Error(err)
						return
					}
					promotedIn = time.Since(killed)
					if err := resume(ctx); err != nil {
						t.Error(err)
					}
					for time.Since(killed) < 20*time.Second {
						lease, _, err := keys.Obtain(ctx, probeLease.scope, probeLease.key, nil)
						if err == nil {
							backIn = time.Since(killed)
							_ = lease.Release(ctx)
							return
						}
						time.Sleep(20 * time.Millisecond)
					}
					t.Error("no lease granted within 20s of the kill")
				})
				// Fresh intents whose lease lives on the dead master: the
				// first answered is when requests flow again.
				for _, in := range probes {
					r.register(in)
					extra = append(extra, in)
					if r.drive(ctx, in, len(extra)%2 == 0, time.Now()) {
						recoveredIn = time.Since(killed)
						break
					}
				}
			})
			injWG.Wait()
			monitor.Wait()
			all = append(all, extra...)
			require.NotNil(t, victim)
			require.NotZero(t, recoveredIn, "a fresh intent on the dead master's slots was answered")

			// Work in flight whose lease was lost, and retries that took a
			// new lease for it while it ran.
			inFlightLost, retaken := 0, 0
			for _, in := range all {
				k := keys.Key(in.scope, in.key)
				if !lost[k] || !overlapped(in, killed, killed, 0) {
					continue
				}
				inFlightLost++
				grants, run := spy.grants(k), in.charged()[0]
				for i := 1; i < len(grants); i++ {
					if grants[i].After(killed) && grants[i].Before(run.end) && grants[i].Before(grants[0].Add(leaseTTL)) {
						retaken++
						break
					}
				}
			}

			f := figures{scenario: "redis-cluster-failover", strategy: strategy, faults: 1, recovered: recoveredIn}
			r.finish(t, &f, all, faultLeaseTTL+time.Second)
			f.log(t)
			t.Logf("FAILOVER strategy=%-6s promoted_in=%v leases_back_in=%v leases_lost=%d in_flight_lost=%d leases_retaken_while_running=%d",
				strategy, promotedIn.Round(time.Millisecond), backIn.Round(time.Millisecond), len(lost), inFlightLost, retaken)
			require.NotZero(t, f.fallbacks, "requests while the slots had no master fell back to the table claim")
			require.NotZero(t, inFlightLost, "work was running when its lease was lost")
			require.NotZero(t, retaken, "a retry took a new lease while the work ran, and its claim was refused")
			r.fresh(t)
		})
	}
}

// masterOfInFlight returns the master holding the lease of an intent whose
// work runs right now, or the first master when none does.
func masterOfInFlight(t *testing.T, r *rig, cl *tempserver.RedisCluster, keys *lock.Locker) *tempserver.Redis {
	t.Helper()
	var key string
	r.intents.Range(func(_, v any) bool {
		in := v.(*intent)
		in.mu.Lock()
		running := len(in.execs) > 0 && in.execs[len(in.execs)-1].end.IsZero()
		in.mu.Unlock()
		if running {
			key = keys.Key(in.scope, in.key)
		}
		return key == ""
	})
	if key == "" {
		masters, err := cl.Masters(t.Context())
		require.NoError(t, err)
		return masters[0]
	}
	m, err := cl.MasterOf(t.Context(), key)
	require.NoError(t, err)
	return m
}
