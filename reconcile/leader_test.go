package reconcile_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	pool := f.pool(t)
	store, err := durable.New(pool, f.cfg)
	require.NoError(t, err)
	g, err := idem.New(store, &idem.Config{Logger: quiet(), WorkTimeout: 10 * time.Second})
	require.NoError(t, err)
	rec, err := reconcile.New(g, store, pool, resolve, nil)
	require.NoError(t, err)
	return &bundle{ctx: f.ctx, guard: g, store: store, pool: f.direct, res: &resolver{}}, rec
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
