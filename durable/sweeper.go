package durable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/idemguard/idem/internal/periodic"
)

// SweeperConfig tunes a [Sweeper]. A nil *SweeperConfig is valid and gives
// every default.
type SweeperConfig struct {
	// Interval is the time between the end of one run and the start of the
	// next. Defaults to 1h.
	Interval time.Duration
	// BatchSize is the number of expired rows one DELETE removes: the bound
	// on how many row locks one statement holds, and for how long. Defaults
	// to 1000.
	BatchSize int
	// BatchPause is slept between two batches of one run, to leave the
	// database's CPU and I/O to the requests being served while a large
	// backlog is swept. A negative value means no pause. Defaults to 10ms.
	BatchPause time.Duration
	// BatchTimeout bounds each DELETE. A batch runs to its end even when
	// the run's context is cancelled, so that stopping never cancels a
	// statement half-way; this timeout is what bounds it then. Defaults to
	// 30s.
	BatchTimeout time.Duration
	// MeterProvider, when set, receives the sweeper's metrics through the
	// OpenTelemetry metric API, for every run that obtained the lease (and
	// every run that failed before it could): the counter
	// "idem.sweep.deleted" (rows), the counter "idem.sweep.runs" and the
	// histogram "idem.sweep.duration" (seconds), both by outcome (ok, error,
	// stopped). Give it the Guard's (idem.Config.MeterProvider). Defaults
	// to nil: no metrics.
	MeterProvider metric.MeterProvider
	// OnSweep, when set, is called after every run with the number of rows
	// it deleted (also when it failed part-way), how long it took and its
	// error (nil on success; wrapping the context's error when the run was
	// stopped). It is not called for rounds skipped because another
	// instance held the lease. It is called from the
	// goroutine that runs the sweep and must not block for long. Defaults
	// to nil.
	OnSweep func(deleted int64, took time.Duration, err error)
}

// Sweeper deletes the rows of a [Store] past their retention, periodically
// and one instance at a time across a fleet (the table's "sweep" lease, see
// [Leader]), in bounded batches.
//
// Expired rows are already invisible to every Store call (see
// Config.Retention): sweeping only reclaims space, so a skipped or failed
// run is never a correctness problem.
//
// A Sweeper is safe for concurrent use; [Sweeper.Run] may be running at most
// once per Sweeper at a time.
type Sweeper struct {
	store   *Store // bound to db
	cfg     SweeperConfig
	leader  *Leader
	loop    periodic.Runner
	metrics sweepMetrics
}

// NewSweeper returns a Sweeper of store's table that runs its statements,
// the lease's and the DELETEs, on db: normally the pool the store runs on,
// directly or through any connection pooler (never a transaction: each
// statement commits on its own). A nil cfg gives every default. Invalid
// fields are reported by name.
//
// The lease is renewed every BatchTimeout and lasts four times that: a
// sweeper that dies mid-run delays the next run on another instance by up
// to 2m with the defaults.
func NewSweeper(store *Store, db DB, cfg *SweeperConfig) (*Sweeper, error) {
	if store == nil {
		return nil, errors.New("durable: NewSweeper: nil store")
	}
	if db == nil {
		return nil, errors.New("durable: NewSweeper: nil db")
	}
	var c SweeperConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Interval == 0 {
		c.Interval = DefaultSweepInterval
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultSweepBatchSize
	}
	if c.BatchPause == 0 {
		c.BatchPause = DefaultSweepBatchPause
	}
	if c.BatchTimeout == 0 {
		c.BatchTimeout = DefaultSweepBatchTimeout
	}
	switch {
	case c.Interval < 0:
		return nil, fmt.Errorf("durable: SweeperConfig.Interval: must be positive, got %v", c.Interval)
	case c.BatchSize < 0:
		return nil, fmt.Errorf("durable: SweeperConfig.BatchSize: must be positive, got %d", c.BatchSize)
	case c.BatchTimeout < 0:
		return nil, fmt.Errorf("durable: SweeperConfig.BatchTimeout: must be positive, got %v", c.BatchTimeout)
	}
	leader, err := NewLeader(db, store.Table(), "sweep", c.BatchTimeout)
	if err != nil {
		return nil, fmt.Errorf("durable: NewSweeper: %w", err)
	}
	m, err := newSweepMetrics(c.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("durable: SweeperConfig.MeterProvider: %w", err)
	}
	return &Sweeper{
		store:   store.WithDB(db),
		cfg:     c,
		leader:  leader,
		metrics: m,
	}, nil
}

// Run sweeps now, then again Interval after the end of each run, until ctx
// ends. Each run is [Sweeper.SweepOnce]; its result is logged and reported
// to OnSweep, and a failed run does not stop Run: the next one comes at the
// next interval.
//
// When ctx ends, the batch in progress (if any) runs to its end, the lease
// is given back, and Run returns nil. It returns an error only when Run is
// already running on this Sweeper.
func (sw *Sweeper) Run(ctx context.Context) error {
	if !sw.loop.Run(ctx, sw.cfg.Interval, func(ctx context.Context) { _, _ = sw.SweepOnce(ctx) }) {
		return errors.New("durable: Sweeper.Run is already running")
	}
	return nil
}

// SweepOnce runs one sweep, for tests and for cron-style use (the only way to
// sweep outside Run): it takes the table's sweep lease and, when it gets it,
// deletes expired rows in batches of BatchSize (one statement each, with
// BatchPause between them) until a batch deletes fewer than BatchSize rows,
// renewing the lease meanwhile. It returns how many rows it deleted.
//
// When another instance holds the lease it returns 0 and an error wrapping
// [ErrLocked] without deleting anything. When ctx ends, or the lease could
// not be renewed ([ErrLeaseLost]), it stops after the batch in progress and
// returns the count so far with an error wrapping the cause. The result is
// logged and, unless the round was skipped, reported to OnSweep.
func (sw *Sweeper) SweepOnce(ctx context.Context) (int64, error) {
	start := time.Now()
	var deleted int64
	err := sw.leader.Do(ctx, func(ctx context.Context) error {
		var from time.Time // each batch goes on where the last one ended
		for {
			if err := ctx.Err(); err != nil {
				return &opError{op: "sweep", err: err}
			}
			n, newest, err := sw.batch(ctx, from)
			deleted += n
			from = newest
			if err != nil {
				return err
			}
			if n < int64(sw.cfg.BatchSize) {
				return nil
			}
			if sw.cfg.BatchPause > 0 {
				t := time.NewTimer(sw.cfg.BatchPause)
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

// batch deletes one batch of rows created at or after from. The statement is
// not cancelled with ctx: a stop waits for it, bounded by BatchTimeout.
func (sw *Sweeper) batch(ctx context.Context, from time.Time) (int64, time.Time, error) {
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sw.cfg.BatchTimeout)
	defer cancel()
	return sw.store.sweepBatch(bctx, "sweep", sw.cfg.BatchSize, from)
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
	if sw.cfg.OnSweep != nil {
		sw.cfg.OnSweep(deleted, took, err)
	}
}
