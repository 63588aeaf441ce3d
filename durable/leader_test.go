package durable_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/faultproxy"
	"github.com/idemguard/idem/internal/testdb"
)

// leaderTarget is where the leaders' statements go: PostgreSQL directly, or
// PgBouncer in transaction mode, where consecutive statements of one client
// connection run on whichever server session is free.
type leaderTarget struct {
	name string
	dsn  func() string
	pool func(testing.TB) *pgxpool.Pool
}

var leaderTargets = []leaderTarget{
	{"postgres", testdb.URL, testdb.Pool},
	{"pgbouncer", testdb.BouncerURL, testdb.BouncerPool},
}

// forEachTarget runs fn, in parallel, once per target, with a store of its
// own migrated schema (reached directly, for the test's own reads).
func forEachTarget(t *testing.T, fn func(t *testing.T, b *bundle, target leaderTarget)) {
	for _, target := range leaderTargets {
		t.Run("via="+target.name, func(t *testing.T) {
			fn(t, setup(t, nil), target)
		})
	}
}

// leader is one instance's holder of the job "test-job" on b's table: a
// Store over the instance's db, leading with tail.
type leader struct {
	store *durable.Store
	tail  time.Duration
}

func (l leader) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	return l.store.Lead(ctx, "test-job", l.tail, fn)
}

func newLeader(t *testing.T, db durable.DB, b *bundle, tail time.Duration) leader {
	t.Helper()
	store, err := durable.New(db, &durable.Config{Schema: schemaOf(b.store)})
	require.NoError(t, err)
	return leader{store: store, tail: tail}
}

// leadership records who acts as the leader, and fails the test as soon as
// two do at once.
type leadership struct {
	t      *testing.T
	mu     sync.Mutex
	active string // who leads now; "" for nobody
	events []string
}

func (l *leadership) enter(who string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.active != "" {
		l.t.Errorf("%s leads while %s still does", who, l.active)
	}
	l.active = who
	l.events = append(l.events, who+" leads")
}

func (l *leadership) leave(who string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.active == who {
		l.active = ""
	}
	l.events = append(l.events, who+" stops")
}

func (l *leadership) log() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.events...)
}

// TestLeaderOneAtATime races eight instances (two pools) for one job: every
// run happens, never two at once.
func TestLeaderOneAtATime(t *testing.T) {
	forEachTarget(t, func(t *testing.T, b *bundle, target leaderTarget) {
		pools := []*pgxpool.Pool{target.pool(t), target.pool(t)}
		lead := &leadership{t: t}
		var (
			wg    sync.WaitGroup
			runs  atomic.Int32
			start = make(chan struct{})
		)
		const instances, want = 8, 40
		for i := range instances {
			pool := pools[i%len(pools)]
			l := newLeader(t, pool, b, time.Minute)
			who := string(rune('A' + i))
			wg.Go(func() {
				<-start
				for runs.Load() < want {
					err := l.Do(b.ctx, func(ctx context.Context) error {
						lead.enter(who)
						defer lead.leave(who)
						runs.Add(1)
						// A round trip while leading: a window for
						// another to lead too, were the lease not held.
						_, err := pool.Exec(ctx, "SELECT 1")
						return err
					})
					if err != nil && !errors.Is(err, durable.ErrLocked) {
						t.Error(err)
						return
					}
				}
			})
		}
		close(start)
		wg.Wait()
		require.GreaterOrEqual(t, runs.Load(), int32(want))
	})
}

// TestLeaderMovesWhenTheLeaderStops: while A leads, B is refused; once A
// stops, B leads at its next try.
func TestLeaderMovesWhenTheLeaderStops(t *testing.T) {
	forEachTarget(t, func(t *testing.T, b *bundle, target leaderTarget) {
		a, bb := newLeader(t, target.pool(t), b, time.Minute), newLeader(t, target.pool(t), b, time.Minute)
		lead := &leadership{t: t}
		actx, stopA := context.WithCancel(b.ctx)
		leading := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- a.Do(actx, func(ctx context.Context) error {
				lead.enter("A")
				defer lead.leave("A")
				close(leading)
				<-ctx.Done()
				return ctx.Err()
			})
		}()
		<-leading
		for range 5 {
			err := bb.Do(b.ctx, func(context.Context) error {
				lead.enter("B")
				lead.leave("B")
				return nil
			})
			require.ErrorIs(t, err, durable.ErrLocked)
		}
		stopA()
		require.ErrorIs(t, <-done, context.Canceled)
		require.NoError(t, bb.Do(b.ctx, func(context.Context) error {
			lead.enter("B")
			lead.leave("B")
			return nil
		}))
		require.Equal(t, []string{"A leads", "A stops", "B leads", "B stops"}, lead.log())
	})
}

// TestLeaderRenewsItsLease: a run outlives the lease's length, renewing it,
// and nobody else leads meanwhile.
func TestLeaderRenewsItsLease(t *testing.T) {
	forEachTarget(t, func(t *testing.T, b *bundle, target leaderTarget) {
		// The lease lasts 4s; a renewal may take up to 1.5s (a loaded
		// machine) before the leader gives up.
		const tail = time.Second
		a, bb := newLeader(t, target.pool(t), b, tail), newLeader(t, target.pool(t), b, tail)
		expiry := func() time.Time {
			var at time.Time
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT expires_at FROM `+leaseTable(b)+` WHERE job = 'test-job'`).Scan(&at))
			return at
		}
		var refused int
		err := a.Do(b.ctx, func(ctx context.Context) error {
			first := expiry()
			// Until the lease has been renewed past twice its length
			// (both times on the database's clock), B is refused.
			for expiry().Before(first.Add(4 * tail)) {
				err := bb.Do(b.ctx, func(context.Context) error { return errors.New("B leads while A does") })
				require.ErrorIs(t, err, durable.ErrLocked)
				refused++
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(tail / 5):
				}
			}
			return nil
		})
		require.NoError(t, err, "the lease was renewed in time")
		require.Positive(t, refused)
	})
}

// TestLeaderStopsBeforeItsLeaseExpires: the leader's connection stalls, so
// its renewals hang. It stops leading (its ctx is cancelled) before its lease
// can have expired; B, refused until then, leads after.
func TestLeaderStopsBeforeItsLeaseExpires(t *testing.T) {
	forEachTarget(t, func(t *testing.T, b *bundle, target leaderTarget) {
		const tail = 250 * time.Millisecond
		cfg, err := pgxpool.ParseConfig(target.dsn())
		require.NoError(t, err)
		proxy := faultproxy.Start(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
		host, port, err := net.SplitHostPort(proxy.Addr())
		require.NoError(t, err)
		p, err := strconv.ParseUint(port, 10, 16)
		require.NoError(t, err)
		cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
		viaProxy, err := pgxpool.NewWithConfig(b.ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(viaProxy.Close)
		t.Cleanup(func() { proxy.CutAll() }) // first: the pool then closes at once

		a, bb := newLeader(t, viaProxy, b, tail), newLeader(t, target.pool(t), b, tail)
		lead := &leadership{t: t}
		leading := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- a.Do(b.ctx, func(ctx context.Context) error {
				lead.enter("A")
				defer lead.leave("A")
				close(leading)
				<-ctx.Done()
				return ctx.Err()
			})
		}()
		<-leading
		proxy.Stall()
		var refused int
		for deadline := time.Now().Add(30 * time.Second); ; {
			require.True(t, time.Now().Before(deadline), "B never led")
			err := bb.Do(b.ctx, func(context.Context) error {
				lead.enter("B")
				lead.leave("B")
				return nil
			})
			if err == nil {
				break
			}
			require.ErrorIs(t, err, durable.ErrLocked)
			refused++
			time.Sleep(tail / 10) // pace the tries; the loop ends on B's success
		}
		select {
		case err = <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("A went on leading")
		}
		require.ErrorIs(t, err, durable.ErrLeaseLost)
		require.Equal(t, []string{"A leads", "A stops", "B leads", "B stops"}, lead.log())
		require.Positive(t, refused, "B was refused while A's lease was live")
	})
}

// TestLeadRejects names what is wrong, and calls nothing.
func TestLeadRejects(t *testing.T) {
	store, err := durable.New(nopDB{}, nil)
	require.NoError(t, err)
	fn := func(context.Context) error { t.Fatal("called"); return nil }
	require.ErrorContains(t, store.Lead(t.Context(), "", time.Second, fn), "job")
	require.ErrorContains(t, store.Lead(t.Context(), "job", 0, fn), "tail")
	require.ErrorContains(t, store.WithDB(nopDB{}).Lead(t.Context(), "job", time.Second, fn), "bound to a caller's transaction")
}

// leaseTable is the lease table of b's store (<table>_leases).
func leaseTable(b *bundle) string {
	t := b.store.Table()
	return t[:len(t)-1] + `_leases"`
}

// TestSweepersTakeTurns runs two sweepers on two instances' pools: while one
// sweeps (paused between its batches), the other is refused and deletes
// nothing; once it stops, the other sweeps the rest.
func TestSweepersTakeTurns(t *testing.T) {
	forEachTarget(t, func(t *testing.T, b *bundle, target leaderTarget) {
		seedAged(t, b.ctx, b.pool, b.store, "expired", 100, "25 hours")
		newSweeper := func(tune durable.SweeperTuning) *durable.Sweeper {
			store, err := durable.New(target.pool(t), &durable.Config{Schema: schemaOf(b.store)})
			require.NoError(t, err)
			sw, err := durable.NewSweeper(store)
			require.NoError(t, err)
			return durable.TuneSweeper(sw, tune)
		}
		first := newSweeper(durable.SweeperTuning{BatchSize: 10, BatchPause: time.Hour})
		second := newSweeper(durable.SweeperTuning{BatchSize: 10, BatchPause: -1})

		ctx, stop := context.WithCancel(b.ctx)
		type result struct {
			n   int64
			err error
		}
		done := make(chan result, 1)
		go func() {
			n, err := first.SweepOnce(ctx)
			done <- result{n, err}
		}()
		// The first batch is done: the first sweeper leads, in its pause.
		for deadline := time.Now().Add(10 * time.Second); b.count(t) != 90; time.Sleep(5 * time.Millisecond) {
			require.True(t, time.Now().Before(deadline), "the first batch did not happen")
		}
		for range 5 {
			n, err := second.SweepOnce(b.ctx)
			require.ErrorIs(t, err, durable.ErrLocked)
			require.Zero(t, n)
		}
		require.Equal(t, 90, b.count(t))
		stop()
		r := <-done
		require.ErrorIs(t, r.err, context.Canceled)
		require.EqualValues(t, 10, r.n)
		n, err := second.SweepOnce(b.ctx)
		require.NoError(t, err)
		require.EqualValues(t, 90, n)
		require.Zero(t, b.count(t))
	})
}

// TestLeaderFencesTheStoresWrites: the Store's writes made with a
// Leader.Do's context (context.WithoutCancel of it too) — a settle, a
// release, a postponement, the scan's mark — change their row while the
// lease is live, and change nothing, with durable.ErrLeaseLost, once the
// lease has passed on the database's clock or another holder has taken it:
// what a leader paused past its lease would write when it resumes.
func TestLeaderFencesTheStoresWrites(t *testing.T) {
	for _, notify := range []bool{false, true} {
		for _, lease := range []string{"live", "passed", "taken"} {
			t.Run(fmt.Sprintf("notify=%t/lease=%s", notify, lease), func(t *testing.T) {
				b := setup(t, &durable.Config{Notify: notify})
				// A tail of a minute: no renewal while the test runs.
				l := newLeader(t, b.pool, b, time.Minute)
				settled, released, postponed := params(t, "u", "settled", "x"), params(t, "u", "released", "x"), params(t, "u", "postponed", "x")
				for _, p := range []idem.ClaimParams{settled, released, postponed} {
					b.claim(t, p)
				}
				var wakes []<-chan struct{} // of the settled and the released key
				if notify {
					lis := newListener(t, b)
					for _, p := range []idem.ClaimParams{settled, released} {
						wake, cancel := lis.Subscribe(p.Scope, p.Key)
						t.Cleanup(cancel)
						wakes = append(wakes, wake)
					}
				}
				mark := time.Now().Add(-time.Hour).UTC().Truncate(time.Microsecond)
				answer := idem.Response{Status: 201, Body: []byte("settled")}
				require.NoError(t, l.Do(b.ctx, func(ctx context.Context) error {
					switch lease {
					case "passed":
						_, err := b.pool.Exec(ctx, `UPDATE `+leaseTable(b)+` SET expires_at = now() - interval '1 millisecond'`)
						require.NoError(t, err)
					case "taken":
						_, err := b.pool.Exec(ctx, `UPDATE `+leaseTable(b)+` SET holder = 'another'`)
						require.NoError(t, err)
					}
					ctx = context.WithoutCancel(ctx)
					errs := []error{
						b.store.Complete(ctx, settled.Scope, settled.Key, settled.Owner, answer),
						b.store.Release(ctx, released.Scope, released.Key, released.Owner),
						b.store.Postpone(ctx, durable.Due{Scope: postponed.Scope, Key: postponed.Key, Owner: postponed.Owner}, 1, time.Hour),
						b.store.MarkScanned(ctx, mark),
					}
					for i, err := range errs {
						if lease == "live" {
							require.NoError(t, err, "write %d", i)
						} else {
							require.ErrorIs(t, err, durable.ErrLeaseLost, "write %d", i)
						}
					}
					return nil
				}))

				applied := lease == "live"
				rec, err := b.store.Get(b.ctx, settled.Scope, settled.Key)
				require.NoError(t, err)
				require.Equal(t, applied, rec.Answer != nil, "settled")
				_, err = b.store.Get(b.ctx, released.Scope, released.Key)
				if applied {
					require.ErrorIs(t, err, idem.ErrNotFound, "released")
				} else {
					require.NoError(t, err, "still in progress")
				}
				var attempts int
				require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT reconcile_attempts FROM `+b.store.Table()+` WHERE key = 'postponed'`).Scan(&attempts))
				require.Equal(t, applied, attempts == 1, "postponed")
				var marked bool
				require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT FROM `+stateTable(b.store.Table())+` WHERE scanned_to = $1)`, mark).Scan(&marked))
				require.Equal(t, applied, marked, "marked")
				for _, wake := range wakes {
					if applied {
						woken(t, wake, "a fenced write announces its key")
					} else {
						quietFor(t, wake, 200*time.Millisecond, "a write refused by its fence announces nothing")
					}
				}
			})
		}
	}
}
