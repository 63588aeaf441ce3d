package durable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemguard/idem/internal/periodic"
)

// What a [Sweeper] does, when.
const (
	// sweepInterval is the time between the end of one run and the start
	// of the next.
	sweepInterval = time.Hour
	// sweepBatchSize is the number of expired rows one DELETE removes: the
	// bound on how many row locks one statement holds, and for how long.
	sweepBatchSize = 1000
	// sweepBatchPause is slept between two batches of one run, to leave
	// the database's CPU and I/O to the requests being served while a
	// large backlog is swept.
	sweepBatchPause = 10 * time.Millisecond
	// sweepBatchTimeout bounds each DELETE. A batch runs to its end even
	// when the run's context is cancelled, so that stopping never cancels a
	// statement half-way; this timeout is what bounds it then. The sweep
	// lease is renewed every sweepBatchTimeout and lasts four times that.
	sweepBatchTimeout = 30 * time.Second
)

// Sweeper deletes the rows of a [Store] past their retention, hourly and one
// instance at a time across a fleet (the table's "sweep" lease, see
// [Store.Lead]), in batches of 1000 rows with a 10ms pause between them, each
// batch one short DELETE ... FOR UPDATE SKIP LOCKED bounded by 30s.
//
// Expired rows are already invisible to every Store call (see
// Config.Retention): sweeping only reclaims space, so a skipped or failed
// run is never a correctness problem.
//
// A Sweeper is safe for concurrent use; [Sweeper.Run] may be running at most
// once per Sweeper at a time.
type Sweeper struct {
	store   *Store
	leader  *leader
	loop    periodic.Runner
	metrics sweepMetrics
	// The tests' knobs (export_test.go); the constants above otherwise.
	interval, pause, timeout time.Duration
	batch                    int
	onSweep                  func(deleted int64, err error)
}

// NewSweeper returns a Sweeper of store's table, which runs its statements,
// the lease's and the DELETEs, on the store's database: a pool or a
// connection, directly or through any connection pooler, never a
// transaction (each statement commits on its own). It logs to the store's
// Config.Logger and reports to its Config.MeterProvider. A sweeper that dies
// mid-run delays the next run on another instance by up to 2m (the lease).
func NewSweeper(store *Store) (*Sweeper, error) {
	if store == nil {
		return nil, errors.New("durable: NewSweeper: nil store")
	}
	if store.joined {
		return nil, errors.New("durable: NewSweeper: the store is bound to a caller's transaction (Store.WithDB): a sweeper commits each statement on its own")
	}
	l, err := newLeader(store.db, store.table, "sweep", sweepBatchTimeout)
	if err != nil {
		return nil, fmt.Errorf("durable: NewSweeper: %w", err)
	}
	m, err := newSweepMetrics(store.cfg.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("durable: Config.MeterProvider: %w", err)
	}
	return &Sweeper{store: store, leader: l, metrics: m,
		interval: sweepInterval, batch: sweepBatchSize, pause: sweepBatchPause, timeout: sweepBatchTimeout}, nil
}

// Run sweeps now, then again an hour after the end of each run, until ctx
// ends. Each run is [Sweeper.SweepOnce]; its result is logged and measured,
// and a failed run does not stop Run: the next one comes at the next
// interval.
//
// When ctx ends, the batch in progress (if any) runs to its end, the lease
// is given back, and Run returns nil. It returns an error only when Run is
// already running on this Sweeper.
func (sw *Sweeper) Run(ctx context.Context) error {
	if !sw.loop.Run(ctx, sw.interval, func(ctx context.Context) { _, _ = sw.SweepOnce(ctx) }) {
		return errors.New("durable: Sweeper.Run is already running")
	}
	return nil
}

// SweepOnce runs one sweep, for cron-style use (the only way to sweep outside
// Run): it takes the table's sweep lease and, when it gets it, deletes
// expired rows in batches until a batch deletes fewer than a batch's worth,
// renewing the lease meanwhile. It returns how many rows it deleted.
//
// When another instance holds the lease it returns 0 and an error wrapping
// [ErrLocked] without deleting anything. When ctx ends, or the lease could
// not be renewed ([ErrLeaseLost]), it stops after the batch in progress and
// returns the count so far with an error wrapping the cause. The result is
// logged and, unless the round was skipped, measured.
func (sw *Sweeper) SweepOnce(ctx context.Context) (int64, error) {
	start := time.Now()
	var deleted int64
	err := sw.leader.do(ctx, func(ctx context.Context) error {
		var from time.Time // each batch goes on where the last one ended
		for {
			if err := ctx.Err(); err != nil {
				return &opError{op: "sweep", err: err}
			}
			n, newest, err := sw.sweepBatch(ctx, from)
			deleted += n
			from = newest
			if err != nil {
				return err
			}
			if n < int64(sw.batch) {
				return nil
			}
			if sw.pause > 0 {
				t := time.NewTimer(sw.pause)
				select {
				case <-ctx.Done():
				case <-t.C:
				}
				t.Stop()
			}
		}
	})
	took := time.Since(start)
	if errors.Is(err, ErrLocked) {
		sw.store.cfg.Logger.LogAttrs(ctx, slog.LevelDebug, "idem: sweep skipped, another instance holds the lease",
			slog.String("table", sw.store.Table()))
		return 0, &opError{op: "sweep", kind: ErrLocked}
	}
	sw.report(ctx, deleted, took, err)
	return deleted, err
}

// sweepBatch deletes one batch of rows created at or after from. The
// statement is not cancelled with ctx: a stop waits for it, bounded by the
// batch timeout.
func (sw *Sweeper) sweepBatch(ctx context.Context, from time.Time) (int64, time.Time, error) {
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sw.timeout)
	defer cancel()
	return sw.store.sweepBatch(bctx, "sweep", sw.batch, from)
}

func (sw *Sweeper) report(ctx context.Context, deleted int64, took time.Duration, err error) {
	attrs := []slog.Attr{
		slog.String("table", sw.store.Table()),
		slog.Int64("deleted", deleted),
		slog.Duration("took", took),
	}
	outcome := "ok"
	switch {
	case err != nil && ctx.Err() != nil:
		outcome = "stopped"
		sw.store.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "idem: sweep stopped", attrs...)
	case err != nil:
		outcome = "error"
		sw.store.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idem: sweep failed", append(attrs, slog.Any("error", err))...)
	case deleted > 0:
		sw.store.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "idem: swept expired keys", attrs...)
	default:
		sw.store.cfg.Logger.LogAttrs(ctx, slog.LevelDebug, "idem: sweep found nothing to delete", attrs...)
	}
	sw.metrics.record(ctx, deleted, took, outcome)
	if sw.onSweep != nil {
		sw.onSweep(deleted, err)
	}
}
