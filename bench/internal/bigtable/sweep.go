package bigtable

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemguard/idem/durable"
)

// batchTracer times the sweeper's DELETE statements on its pool.
type batchTracer struct {
	mu      sync.Mutex
	batches []time.Duration
	rows    int64
}

type traceStart struct{}

func (t *batchTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(d.SQL, "DELETE FROM") {
		return ctx
	}
	return context.WithValue(ctx, traceStart{}, time.Now())
}

func (t *batchTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	start, ok := ctx.Value(traceStart{}).(time.Time)
	if !ok || d.Err != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.batches = append(t.batches, time.Since(start))
	t.rows += d.CommandTag.RowsAffected()
}

// take returns and forgets the batches timed so far.
func (t *batchTracer) take() ([]time.Duration, int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	b, r := t.batches, t.rows
	t.batches, t.rows = nil, 0
	return b, r
}

// SweepResult is what one sweep of the expired rows cost.
type SweepResult struct {
	Expired int64         // rows past retention before the sweep
	Deleted int64         // rows the Sweeper reported deleting
	Took    time.Duration // the whole SweepOnce, batch pauses included
	Batch   Latency       // each DELETE statement
	Error   string
}

// RowsPerSecond is the sweep's deletion rate, pauses included.
func (s SweepResult) RowsPerSecond() float64 {
	if s.Took <= 0 {
		return 0
	}
	return float64(s.Deleted) / s.Took.Seconds()
}

// sweeperEnv is a Sweeper of the store on a pool of its own whose DELETEs
// are timed.
type sweeperEnv struct {
	pool   *pgxpool.Pool
	sw     *durable.Sweeper
	tracer *batchTracer
}

func newSweeper(ctx context.Context, url string, store *durable.Store) (*sweeperEnv, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	tr := &batchTracer{}
	pc.ConnConfig.Tracer = tr
	pc.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	sw, err := durable.NewSweeper(store, pool, nil) // logs to the store's Config.Logger
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &sweeperEnv{pool: pool, sw: sw, tracer: tr}, nil
}

// sweepOnce runs one SweepOnce with the Sweeper's defaults (batches of
// 1000, 10ms apart) and times it.
// It also returns the duration of each batch.
func (e *sweeperEnv) sweepOnce(ctx context.Context, expired int64) (SweepResult, []time.Duration) {
	e.tracer.take()
	start := time.Now()
	n, err := e.sw.SweepOnce(ctx)
	r := SweepResult{Expired: expired, Deleted: n, Took: time.Since(start)}
	b, _ := e.tracer.take()
	r.Batch = summarize(b, 0, "")
	if err != nil && ctx.Err() == nil {
		r.Error = err.Error()
	}
	return r, b
}
