package durable_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/testdb"
)

// seedAged inserts n answered rows under scope, created and answered the
// given interval (such as '25 hours') ago, in one statement.
func seedAged(t testing.TB, ctx context.Context, pool *pgxpool.Pool, store *durable.Store, scope string, n int, ago string) {
	t.Helper()
	_, err := pool.Exec(ctx, `
INSERT INTO `+store.Table()+` (user_id, key, request_hash, owner_token, response_status, response_headers,
	response_body, created_at, completed_at, hold_until, retention)
SELECT $1, 'key-' || g, sha256(g::text::bytea), decode(md5(g::text), 'hex'), 201, '{}', '',
	now() - $3::interval, now() - $3::interval, now() - $3::interval, `+retentionSQL(store)+`
FROM generate_series(1, $2::int) AS g`, scope, n, ago)
	require.NoError(t, err)
}

// sweepReport is one call of OnSweep.
type sweepReport struct {
	deleted int64
	err     error
}

func newSweeper(t *testing.T, b *bundle, tune durable.SweeperTuning) (*durable.Sweeper, chan sweepReport) {
	t.Helper()
	reports := make(chan sweepReport, 100)
	tune.OnSweep = func(deleted int64, err error) {
		reports <- sweepReport{deleted, err}
	}
	sw, err := durable.NewSweeper(b.store)
	require.NoError(t, err)
	return durable.TuneSweeper(sw, tune), reports
}

func TestSweeperDeletesOnlyExpiredRows(t *testing.T) {
	b := setup(t, nil)
	seedAged(t, b.ctx, b.pool, b.store, "expired", 2500, "25 hours")
	seedAged(t, b.ctx, b.pool, b.store, "live", 10, "23 hours")
	done := params(t, "live", "done", "a")
	b.claim(t, done)
	require.NoError(t, b.store.Complete(b.ctx, done.Scope, done.Key, done.Owner, idem.Response{Status: 200}))
	b.claim(t, params(t, "live", "in-progress", "a"))

	sw, reports := newSweeper(t, b, durable.SweeperTuning{BatchSize: 1000, BatchPause: -1})
	n, err := sw.SweepOnce(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2500, n)
	require.Equal(t, sweepReport{deleted: 2500}, <-reports)
	require.Equal(t, 12, b.count(t))
	_, err = b.store.Get(b.ctx, done.Scope, done.Key)
	require.NoError(t, err)

	n, err = sw.SweepOnce(b.ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, sweepReport{deleted: 0}, <-reports)
}

func TestSweeperBatches(t *testing.T) {
	b := setup(t, nil)
	seedAged(t, b.ctx, b.pool, b.store, "expired", 250, "25 hours")

	// The batch size bounds each statement: a run over 250 rows in
	// batches of 100 deletes 100, 100, then 50, and stops with none left.
	sw, _ := newSweeper(t, b, durable.SweeperTuning{BatchSize: 100, BatchPause: time.Millisecond})
	n, err := sw.SweepOnce(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 250, n)
	require.Zero(t, b.count(t))
}

func TestSweeperOneInstanceAtATime(t *testing.T) {
	b := setup(t, nil)
	seedAged(t, b.ctx, b.pool, b.store, "expired", 100, "25 hours")
	sw, reports := newSweeper(t, b, durable.SweeperTuning{})

	t.Run("skips while another instance holds the lease", func(t *testing.T) {
		ran := false
		err := b.store.Lead(b.ctx, "sweep", time.Minute, func(ctx context.Context) error {
			ran = true
			n, err := sw.SweepOnce(ctx)
			require.ErrorIs(t, err, durable.ErrLocked)
			require.Zero(t, n)
			return nil
		})
		require.NoError(t, err)
		require.True(t, ran)
		require.Equal(t, 100, b.count(t), "nothing deleted")
		require.Empty(t, reports, "a skipped round is not reported")
	})

	t.Run("concurrent sweepers: each row deleted once, the others skip", func(t *testing.T) {
		const n = 8
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			deleted [n]int64
			errs    [n]error
		)
		for i := range n {
			other, _ := newSweeper(t, b, durable.SweeperTuning{BatchSize: 10, BatchPause: time.Millisecond})
			wg.Go(func() {
				<-start
				deleted[i], errs[i] = other.SweepOnce(b.ctx)
			})
		}
		close(start)
		wg.Wait()
		var total int64
		for i := range n {
			if errs[i] != nil {
				require.ErrorIs(t, errs[i], durable.ErrLocked)
				require.Zero(t, deleted[i])
			}
			total += deleted[i]
		}
		require.EqualValues(t, 100, total)
		require.Zero(t, b.count(t))
	})
}

func TestSweeperStopsAfterTheCurrentBatch(t *testing.T) {
	b := setup(t, nil)
	seedAged(t, b.ctx, b.pool, b.store, "expired", 100, "25 hours")
	ctx, cancel := context.WithCancel(b.ctx)
	sw, reports := newSweeper(t, b, durable.SweeperTuning{
		BatchSize:  10,
		BatchPause: time.Hour, // the run waits here after its first batch
	})
	go func() {
		// Stop once the first batch is done: the table shrinks by 10.
		defer cancel()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			var n int
			if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM `+b.store.Table()).Scan(&n); err != nil {
				t.Error(err)
				return
			}
			if n == 90 {
				return
			}
		}
		t.Error("the first batch did not happen")
	}()
	n, err := sw.SweepOnce(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.EqualValues(t, 10, n)
	r := <-reports
	require.EqualValues(t, 10, r.deleted)
	require.ErrorIs(t, r.err, context.Canceled)
	require.Equal(t, 90, b.count(t))

	// The lease was given back: the next run sweeps the rest.
	sw, _ = newSweeper(t, b, durable.SweeperTuning{BatchSize: 10, BatchPause: -1})
	n, err = sw.SweepOnce(b.ctx)
	require.EqualValues(t, 90, n)
	require.NoError(t, err)
}

// TestSweeperRun is not parallel: goleak looks at every goroutine.
func TestSweeperRun(t *testing.T) {
	store, pool := testdb.Store(t, nil)
	b := &bundle{ctx: t.Context(), store: store, pool: pool}
	seedAged(t, b.ctx, b.pool, b.store, "expired", 30, "25 hours")
	// Warm the pool, so that its connections (and their goroutines) exist
	// before the snapshot.
	require.Equal(t, 30, b.count(t))
	leaks := goleak.IgnoreCurrent()

	sw, reports := newSweeper(t, b, durable.SweeperTuning{Interval: time.Hour, BatchSize: 10})
	ctx, cancel := context.WithCancel(b.ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- sw.Run(ctx) }()

	// The first run starts at once and sweeps everything.
	r := <-reports
	require.NoError(t, r.err)
	require.EqualValues(t, 30, r.deleted)
	require.Zero(t, b.count(t))
	require.Error(t, sw.Run(ctx), "Run is already running")

	cancel()
	select {
	case err := <-stopped:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop")
	}
	require.Empty(t, reports, "no second run within the interval")
	goleak.VerifyNone(t, leaks)
}

func TestNewSweeperValidation(t *testing.T) {
	t.Parallel()
	store, err := durable.New(nopDB{}, nil)
	require.NoError(t, err)
	sw, err := durable.NewSweeper(store)
	require.NoError(t, err)
	require.NotNil(t, sw)
	_, err = durable.NewSweeper(nil)
	require.Error(t, err)
	_, err = durable.NewSweeper(store.WithDB(nopDB{}))
	require.ErrorContains(t, err, "bound to a caller's transaction")
}
