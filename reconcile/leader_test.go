package reconcile_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/clock"
	"github.com/idemguard/idem/internal/testdb"
	"github.com/idemguard/idem/reconcile"
)

// fleet is instances of one service sharing a table: each with its own
// pool (to PostgreSQL, or through PgBouncer in transaction mode), store,
// Guard and Reconciler, as separate processes would have.
type fleet struct {
	ctx    context.Context
	direct *pgxpool.Pool // for the test's own statements
	cfg    *durable.Config
	pool   func(testing.TB) *pgxpool.Pool
	lead   *leadership
}

func newFleet(t *testing.T, pool func(testing.TB) *pgxpool.Pool) *fleet {
	t.Helper()
	direct := testdb.Pool(t)
	cfg := &durable.Config{Schema: testdb.Schema(t, direct)}
	require.NoError(t, durable.Migrate(t.Context(), direct, cfg))
	ctx := clock.WithHeadStart(t.Context(), time.Hour) // as in setup
	return &fleet{ctx: ctx, direct: direct, cfg: cfg, pool: pool, lead: &leadership{t: t}}
}

// instance starts one instance whose reconciler resolves with resolve.
func (f *fleet) instance(t *testing.T, resolve reconcile.ResolveFunc) (*bundle, *reconcile.Reconciler) {
	t.Helper()
	return f.instanceOn(t, f.pool(t), reconcile.Tuning{}, resolve)
}

// instanceOn is instance with its statements run through db and its
// reconciler tuned by tune.
func (f *fleet) instanceOn(t *testing.T, db durable.DB, tune reconcile.Tuning, resolve reconcile.ResolveFunc) (*bundle, *reconcile.Reconciler) {
	t.Helper()
	store, err := durable.New(db, f.cfg)
	require.NoError(t, err)
	g, err := idem.New(store, &idem.Config{Logger: quiet(), WorkTimeout: 10 * time.Second})
	require.NoError(t, err)
	rec, err := reconcile.New(g, store, resolve, nil)
	require.NoError(t, err)
	return &bundle{ctx: f.ctx, guard: g, store: store, pool: f.direct, res: &resolver{}}, reconcile.Tune(rec, tune)
}

// leadership records which reconciler is resolving, and fails the test as
// soon as two are at once.
type leadership struct {
	t      *testing.T
	mu     sync.Mutex
	active string
	events []string
}

func (l *leadership) enter(who string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.active != "" {
		l.t.Errorf("%s resolves while %s leads", who, l.active)
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

var poolers = []struct {
	name string
	pool func(testing.TB) *pgxpool.Pool
}{
	{"postgres", testdb.Pool},
	{"pgbouncer", testdb.BouncerPool},
}

// TestReconcilersTakeTurns: two instances' reconcilers, directly and through
// PgBouncer in transaction mode. While the first resolves a key, the second
// is refused; once the first stops, the second leads and settles the key.
func TestReconcilersTakeTurns(t *testing.T) {
	for _, via := range poolers {
		t.Run("via="+via.name, func(t *testing.T) {
			t.Parallel()
			f := newFleet(t, via.pool)
			leading := make(chan struct{})
			a, first := f.instance(t, func(ctx context.Context, _ reconcile.Item) (reconcile.Decision, error) {
				f.lead.enter("A")
				defer f.lead.leave("A")
				close(leading)
				<-ctx.Done() // resolving until A stops
				return reconcile.Decision{}, ctx.Err()
			})
			_, second := f.instance(t, func(context.Context, reconcile.Item) (reconcile.Decision, error) {
				f.lead.enter("B")
				defer f.lead.leave("B")
				return reconcile.Decision{Verdict: reconcile.NothingHappened}, nil
			})
			req := request(newKey())
			a.timedOut(t, req)
			a.age(t, req.Scope, req.Key, "2 minutes")

			actx, stopA := context.WithCancel(f.ctx)
			type outcome struct {
				res reconcile.Result
				err error
			}
			done := make(chan outcome, 1)
			go func() {
				res, err := first.RunOnce(actx)
				done <- outcome{res, err}
			}()
			<-leading
			for range 5 {
				res, err := second.RunOnce(f.ctx)
				require.ErrorIs(t, err, durable.ErrLocked)
				require.Equal(t, reconcile.Result{}, res)
			}
			stopA()
			o := <-done
			require.ErrorIs(t, o.err, context.Canceled)
			require.Equal(t, reconcile.Result{}, o.res, "A stopped before deciding")

			res, err := second.RunOnce(f.ctx)
			require.NoError(t, err)
			require.Equal(t, reconcile.Result{Released: 1}, res)
			require.Equal(t, []string{"A leads", "A stops", "B leads", "B stops"}, f.lead.log())
		})
	}
}

// TestReconcilersRace: four instances' reconcilers run at once over 20 due
// keys, directly and through PgBouncer in transaction mode: one at a time
// resolves, and each key is resolved once.
func TestReconcilersRace(t *testing.T) {
	for _, via := range poolers {
		t.Run("via="+via.name, func(t *testing.T) {
			t.Parallel()
			f := newFleet(t, via.pool)
			var resolved atomic.Int32
			recs := make([]*reconcile.Reconciler, 4)
			var b *bundle
			for i := range recs {
				who := string(rune('A' + i))
				b, recs[i] = f.instance(t, func(ctx context.Context, _ reconcile.Item) (reconcile.Decision, error) {
					f.lead.enter(who)
					defer f.lead.leave(who)
					resolved.Add(1)
					// A round trip while resolving: a window for another
					// reconciler to resolve too, were the lease not held.
					_, err := f.direct.Exec(ctx, "SELECT 1")
					return reconcile.Decision{Verdict: reconcile.NothingHappened}, err
				})
			}
			for range 20 {
				req := request(newKey())
				b.timedOut(t, req)
				b.age(t, req.Scope, req.Key, "2 minutes")
			}
			var (
				wg       sync.WaitGroup
				released atomic.Int32
				start    = make(chan struct{})
			)
			for _, r := range recs {
				wg.Go(func() {
					<-start
					for range 3 {
						res, err := r.RunOnce(f.ctx)
						if err != nil && !errors.Is(err, durable.ErrLocked) {
							t.Error(err)
						}
						released.Add(int32(res.Released))
					}
				})
			}
			close(start)
			wg.Wait()
			require.EqualValues(t, 20, released.Load())
			require.EqualValues(t, 20, resolved.Load(), "each key resolved once")
		})
	}
}

// TestReconcilersPausedLeaderIsFenced: instance A's reconciler decides about
// a key and is paused (as by SIGSTOP) before its decision reaches the
// database, longer than its lease; B leads meanwhile and decides otherwise.
// When A resumes, its decision goes out (a stopped process runs no timer
// before the write it had begun), after its pending lease renewal: both are
// refused, the decision is dropped and counted as skipped, A's run ends with
// durable.ErrLeaseLost, and the key keeps B's decision. Without the fence
// A's stale release frees the key B left in progress, and its retry runs the
// work again; A's stale settle answers it. Directly and through PgBouncer in
// transaction mode.
func TestReconcilersPausedLeaderIsFenced(t *testing.T) {
	// inProgress: the key keeps B's decision (its outcome is unknown, it
	// stays in progress), and a retry does not run the work again.
	inProgress := func(t *testing.T, g *idem.Guard, req idem.Request) {
		w := &work{resp: created("o2")}
		_, out, err := g.Do(t.Context(), req, w.do)
		require.ErrorIs(t, err, idem.ErrInProgress)
		require.Equal(t, idem.OutcomeInProgress, out)
		require.Zero(t, w.n.Load(), "the work never runs twice")
	}
	cases := []struct {
		name string
		a, b reconcile.Decision
		// check sees the key after both decisions, through a Guard.
		check func(t *testing.T, g *idem.Guard, req idem.Request)
	}{
		{
			name:  "A releases, B postpones",
			a:     reconcile.Decision{Verdict: reconcile.NothingHappened},
			b:     reconcile.Decision{Verdict: reconcile.Unknown},
			check: inProgress,
		},
		{
			name:  "A settles, B postpones",
			a:     reconcile.Decision{Verdict: reconcile.Settled, Response: created("o1")},
			b:     reconcile.Decision{Verdict: reconcile.Unknown},
			check: inProgress,
		},
	}
	for _, via := range poolers {
		for _, c := range cases {
			t.Run("via="+via.name+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				f := newFleet(t, via.pool)
				paused := &pausable{db: f.pool(t), arrived: make(chan string, 16)}
				resolving, decide := make(chan struct{}), make(chan struct{})
				// A's lease lasts four StoreTimeouts: 4s.
				a, first := f.instanceOn(t, paused, reconcile.Tuning{StoreTimeout: time.Second},
					func(context.Context, reconcile.Item) (reconcile.Decision, error) {
						close(resolving)
						<-decide
						return c.a, nil
					})
				b, second := f.instance(t, func(context.Context, reconcile.Item) (reconcile.Decision, error) {
					return c.b, nil
				})
				req := request(newKey())
				a.timedOut(t, req)
				a.age(t, req.Scope, req.Key, "2 minutes")

				type outcome struct {
					res reconcile.Result
					err error
				}
				done := make(chan outcome, 1)
				go func() {
					res, err := first.RunOnce(f.ctx)
					done <- outcome{res, err}
				}()
				select {
				case <-resolving:
				case o := <-done:
					t.Fatalf("A never resolved: %+v, %v", o.res, o.err)
				}
				paused.pause()
				close(decide)
				// A's decision is on its way: an update of the key's table.
				decision := "UPDATE " + a.store.Table() + " SET"
				for sql := range paused.arrived {
					if strings.Contains(sql, decision) {
						break
					}
				}

				// B leads once A's lease has passed on the database's
				// clock, and decides.
				var res reconcile.Result
				for deadline := time.Now().Add(30 * time.Second); ; {
					require.True(t, time.Now().Before(deadline), "B never led")
					var err error
					res, err = second.RunOnce(f.ctx)
					if err == nil {
						break
					}
					require.ErrorIs(t, err, durable.ErrLocked)
					time.Sleep(50 * time.Millisecond) // pace the tries; the loop ends when B leads
				}
				require.Equal(t, reconcile.Result{Unknown: 1}, res, "B decided")

				paused.resume()
				o := <-done
				require.ErrorIs(t, o.err, durable.ErrLeaseLost)
				require.Equal(t, reconcile.Result{Skipped: 1}, o.res, "A's decision was dropped")
				require.Zero(t, a.guard.Stats().Settled+a.guard.Stats().Released, "A applied nothing")
				c.check(t, b.guard, req)
			})
		}
	}
}

// pausable is a durable.DB whose statements can be held as those of a
// process stopped by SIGSTOP: from pause, each statement waits, and its SQL
// is sent on arrived; resume lets them go, the last first (a pending lease
// renewal before the decision that waited longer: the worst order), each to
// its end, with its deadline lifted, since a stopped process runs no timer
// before a write it had begun leaves.
type pausable struct {
	db      durable.DB
	arrived chan string

	mu     sync.Mutex
	paused bool
	held   []held
}

type held struct{ release, done chan struct{} }

func (p *pausable) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = true
}

func (p *pausable) resume() {
	p.mu.Lock()
	hs := p.held
	p.paused, p.held = false, nil
	p.mu.Unlock()
	for i := len(hs) - 1; i >= 0; i-- {
		close(hs[i].release)
		<-hs[i].done
	}
}

// wait holds a statement while paused; call done once it has run.
func (p *pausable) wait(ctx context.Context, sql string) (_ context.Context, done func()) {
	p.mu.Lock()
	if !p.paused {
		p.mu.Unlock()
		return ctx, func() {}
	}
	h := held{release: make(chan struct{}), done: make(chan struct{})}
	p.held = append(p.held, h)
	p.mu.Unlock()
	p.arrived <- sql
	<-h.release
	return context.WithoutCancel(ctx), sync.OnceFunc(func() { close(h.done) })
}

func (p *pausable) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	ctx, done := p.wait(ctx, sql)
	defer done()
	return p.db.Exec(ctx, sql, args...)
}

func (p *pausable) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	ctx, done := p.wait(ctx, sql)
	defer done()
	return p.db.Query(ctx, sql, args...)
}

func (p *pausable) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	ctx, done := p.wait(ctx, sql)
	return scanned{p.db.QueryRow(ctx, sql, args...), done}
}

// scanned is a row that calls done once scanned: its statement has run.
type scanned struct {
	pgx.Row
	done func()
}

func (r scanned) Scan(dest ...any) error {
	defer r.done()
	return r.Row.Scan(dest...)
}
