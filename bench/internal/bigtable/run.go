package bigtable

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemguard/idem/durable"
)

// TableName is the table the bench creates, in a schema of its own.
const TableName = "bigtable_keys"

// Config is one run. The zero value of a field gives its default.
type Config struct {
	DatabaseURL string
	// Rows are the sizes, in live rows, ascending. Each size is loaded on
	// top of the previous one. Required.
	Rows []int64
	// Samples per operation and concurrency. Defaults to 3000.
	Samples int
	// Concurrency levels of the measured operations. Defaults to 1 and 8.
	Concurrency []int
	// ExpiredShare is the number of rows loaded just past the retention,
	// for the sweeper, as a share of the live rows. Defaults to 1/24: the
	// keys of one hour, what an hourly sweep finds.
	ExpiredShare float64
	// Chunk is the rows per INSERT of the loader. Defaults to 100000.
	Chunk int64
	// LoadWorkers is how many chunks load at once. Defaults to 2.
	LoadWorkers int
	// Headroom keeps live rows that much younger than the retention, so that
	// none expires during the run: created_at is spread over the last
	// retention - headroom. Defaults to 2h.
	Headroom time.Duration
	// Phase is how long each mixed phase with the sweeper running lasts, at
	// the largest size. 0 gives 60s; negative skips the phases.
	Phase time.Duration
	// Autovacuum adds a phase with the server's autovacuum turned on (ALTER
	// SYSTEM SET autovacuum = on, restored at the end).
	Autovacuum bool
	// Partitions, when positive, creates the table hash-partitioned on
	// user_id into that many partitions (durable.Config.Partitions); sizes
	// and statistics are summed over them.
	Partitions int
	// Schema is the schema to create (and drop at the end). Defaults to
	// idem_bigtable_<random hex>.
	Schema string
	// Command is the invocation, for the report.
	Command string
	// Progress receives one line per step. Defaults to io.Discard.
	Progress io.Writer
}

func (c *Config) defaults() error {
	if len(c.Rows) == 0 {
		return errors.New("bigtable: no sizes (-rows)")
	}
	for i, n := range c.Rows {
		if n < inProgressMod || (i > 0 && n <= c.Rows[i-1]) {
			return fmt.Errorf("bigtable: -rows %v must be ascending and at least %d", c.Rows, inProgressMod)
		}
	}
	if c.Samples == 0 {
		c.Samples = 3000
	}
	if len(c.Concurrency) == 0 {
		c.Concurrency = []int{1, 8}
	}
	if slices.ContainsFunc(c.Concurrency, func(n int) bool { return n < 1 }) || c.Samples < 1 {
		return fmt.Errorf("bigtable: samples %d and concurrency %v must be positive", c.Samples, c.Concurrency)
	}
	if c.ExpiredShare == 0 {
		c.ExpiredShare = 1.0 / 24
	}
	if c.ExpiredShare < 0 || c.ExpiredShare > 1 {
		return fmt.Errorf("bigtable: expired share %v is outside [0, 1]", c.ExpiredShare)
	}
	if c.Chunk == 0 {
		c.Chunk = 100_000
	}
	if c.LoadWorkers == 0 {
		c.LoadWorkers = 2
	}
	if c.Headroom == 0 {
		c.Headroom = 2 * time.Hour
	}
	if c.Headroom >= durable.DefaultRetention {
		return fmt.Errorf("bigtable: headroom %v must be below the retention %v", c.Headroom, durable.DefaultRetention)
	}
	if c.Phase == 0 {
		c.Phase = 60 * time.Second
	}
	if c.Schema == "" {
		var b [4]byte
		_, _ = crand.Read(b[:])
		c.Schema = "idem_bigtable_" + hex.EncodeToString(b[:])
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	return nil
}

// Report is what a run measured.
type Report struct {
	Command           string
	Started, Finished time.Time
	Settings          []Setting // at the start
	Table             string
	Migrations        []int64 // versions durable.Migrate applied
	Partitions        int     // hash partitions on user_id; 0: a plain table
	Retention         time.Duration
	Headroom          time.Duration
	ExpiredShare      float64
	Samples           int
	Concurrency       []int
	Steps             []Step
	Phases            []Phase
	Interrupted       bool
	Notes             []string
}

// Step is one size.
type Step struct {
	Live, Expired int64         // rows of each kind before the operations
	Loaded        int64         // rows inserted at this step
	Load          time.Duration // the INSERTs
	Vacuum        time.Duration // VACUUM ANALYZE after them
	Sizes         Sizes         // after VACUUM ANALYZE, before the operations
	Ops           []OpResult
	Hot           []HotResult
	Sweep         SweepResult
}

// OpResult is one operation at one concurrency.
type OpResult struct {
	Op   string
	Conc int
	Latency
}

// HotResult counts the updates of the Complete calls at one concurrency.
type HotResult struct {
	Conc        int
	Upd, HotUpd int64 // n_tup_upd and n_tup_hot_upd growth
}

// Share is HotUpd / Upd.
func (h HotResult) Share() float64 {
	if h.Upd == 0 {
		return 0
	}
	return float64(h.HotUpd) / float64(h.Upd)
}

// Phase is mixed load (half claim + complete of new keys, half replays) with
// the Sweeper sweeping a fresh batch of expired rows at the same time.
type Phase struct {
	Live, Expired      int64
	Autovacuum         string // the server's setting during the phase
	Conc               int
	Duration           time.Duration
	Ops                []OpResult
	Sweep              SweepResult // all the phase's sweeps together
	AutovacuumSeconds  int         // seconds autovacuum was seen working on the table
	AutovacuumRuns     int64       // autovacuum_count growth
	DeadBefore, DeadAt int64       // n_dead_tup at the start and the end
}

// Run loads and measures every size of cfg and returns the report. When ctx
// ends it returns the report of what ran with Interrupted set, and ctx's
// error. The schema is dropped in every case.
func Run(ctx context.Context, cfg Config) (rep *Report, err error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	pc, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	pc.MaxConns = int32(slices.Max(cfg.Concurrency) + cfg.LoadWorkers + 2)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}

	// The bench measures each call's latency with its wait for a connection
	// counted, so a call must not be refused for that wait: AdmissionWait
	// (100ms by default) would turn the pool's queue under mixed load into
	// errors.
	dcfg := &durable.Config{Schema: cfg.Schema, Table: TableName, Partitions: cfg.Partitions, AdmissionWait: time.Minute,
		Logger: slog.New(slog.DiscardHandler)} // the sweeper's lines would break the progress lines
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		if _, derr := pool.Exec(dctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{cfg.Schema}.Sanitize()+" CASCADE"); derr != nil {
			err = errors.Join(err, fmt.Errorf("drop schema %s: %w", cfg.Schema, derr))
		}
	}()
	if err := durable.Migrate(ctx, pool, dcfg); err != nil {
		return nil, err
	}
	var versions []int64
	if err := pool.QueryRow(ctx, "SELECT array_agg(version ORDER BY version) FROM "+
		pgx.Identifier{cfg.Schema, "idem_migrations"}.Sanitize()+" WHERE table_name = $1", TableName).Scan(&versions); err != nil {
		return nil, fmt.Errorf("migrations applied: %w", err)
	}
	store, err := durable.New(pool, dcfg)
	if err != nil {
		return nil, err
	}
	sweeper, err := newSweeper(ctx, cfg.DatabaseURL, store)
	if err != nil {
		return nil, fmt.Errorf("sweeper: %w", err)
	}
	defer sweeper.pool.Close()

	r := &runner{cfg: cfg, pool: pool, store: store, table: store.Table(), sweeper: sweeper}
	rep = &Report{
		Command: cfg.Command, Started: time.Now(), Table: r.table,
		Retention: store.Retention(), Headroom: cfg.Headroom, ExpiredShare: cfg.ExpiredShare,
		Samples: cfg.Samples, Concurrency: cfg.Concurrency, Migrations: versions, Partitions: cfg.Partitions,
	}
	defer func() {
		rep.Finished = time.Now()
		if ctx.Err() != nil {
			rep.Interrupted = true
		}
	}()
	if rep.Settings, err = readSettings(ctx, pool); err != nil {
		return rep, err
	}
	fmt.Fprintf(cfg.Progress, "bigtable: table %s, sizes %v, %d samples per operation at concurrency %v\n",
		r.table, cfg.Rows, cfg.Samples, cfg.Concurrency)
	for _, n := range cfg.Rows {
		st, err := r.step(ctx, n)
		if st != nil {
			rep.Steps = append(rep.Steps, *st)
		}
		if err != nil {
			return rep, err
		}
	}
	if time.Since(r.firstLoad) > cfg.Headroom {
		rep.Notes = append(rep.Notes, fmt.Sprintf("the run outlasted the headroom (%v): the oldest live rows may have expired before the last measurements", cfg.Headroom))
	}
	if cfg.Phase < 0 {
		return rep, nil
	}
	ph, err := r.phase(ctx)
	if err != nil {
		return rep, err
	}
	rep.Phases = append(rep.Phases, ph)
	if !cfg.Autovacuum {
		return rep, nil
	}
	sw, err := enableAutovacuum(ctx, pool, cfg.Progress)
	if sw != nil {
		defer func() { err = errors.Join(err, sw.Restore()) }()
	}
	if err != nil {
		return rep, err
	}
	ph, err = r.phase(ctx)
	if err != nil {
		return rep, err
	}
	rep.Phases = append(rep.Phases, ph)
	return rep, nil
}

type runner struct {
	cfg       Config
	pool      *pgxpool.Pool
	store     *durable.Store
	table     string
	sweeper   *sweeperEnv
	live      int64 // rows 0 <= n < live of the live batch are loaded
	extra     int64 // rows the measured claims added
	batches   int   // expired batches loaded so far
	firstLoad time.Time
	seed      uint64
}

// loadExpired loads a fresh batch of rows just past the retention.
func (r *runner) loadExpired(ctx context.Context) (int64, time.Duration, error) {
	n := int64(math.Round(float64(r.live) * r.cfg.ExpiredShare))
	if n == 0 {
		return 0, 0, nil
	}
	r.batches++
	took, err := load(ctx, r.pool, r.table, batch{
		tag: fmt.Sprintf("%s%d", expiredTagBase, r.batches), from: 0, to: n,
		age: r.store.Retention() + time.Minute, spread: time.Hour,
	}, r.cfg.Chunk, r.cfg.LoadWorkers)
	return n, took, err
}

func (r *runner) vacuumAnalyze(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	_, err := r.pool.Exec(ctx, "VACUUM ANALYZE "+r.table)
	return time.Since(start), err
}

func (r *runner) step(ctx context.Context, live int64) (*Step, error) {
	cfg := r.cfg
	st := &Step{Live: live, Loaded: live - r.live}
	if r.firstLoad.IsZero() {
		r.firstLoad = time.Now()
	}
	took, err := load(ctx, r.pool, r.table, batch{
		tag: liveTag, from: r.live, to: live, spread: r.store.Retention() - cfg.Headroom,
	}, cfg.Chunk, cfg.LoadWorkers)
	st.Load = took
	if err != nil {
		return nil, err
	}
	r.live = live
	expired, took, err := r.loadExpired(ctx)
	st.Expired, st.Loaded, st.Load = expired, st.Loaded+expired, st.Load+took
	if err != nil {
		return nil, err
	}
	if st.Vacuum, err = r.vacuumAnalyze(ctx); err != nil {
		return nil, fmt.Errorf("vacuum analyze: %w", err)
	}
	if st.Sizes, err = readSizes(ctx, r.pool, r.table, live+expired+r.extra); err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.Progress, "%12d live  loaded %d rows in %v (%.0f rows/s), VACUUM ANALYZE %v, total %s\n",
		live, st.Loaded, st.Load.Round(time.Millisecond), float64(st.Loaded)/st.Load.Seconds(),
		st.Vacuum.Round(time.Millisecond), mib(st.Sizes.Total))

	c := &client{store: r.store, live: live}
	for _, conc := range cfg.Concurrency {
		before, err := readStats(ctx, r.pool, r.table)
		if err != nil {
			return st, err
		}
		rec := newRecorder()
		r.seed++
		fanOut(ctx, conc, cfg.Samples, r.seed, func(rng *rand.Rand) { c.claimAndComplete(ctx, rng, rec) })
		after, err := readStats(ctx, r.pool, r.table)
		if err != nil {
			return st, err
		}
		st.Hot = append(st.Hot, HotResult{Conc: conc, Upd: after.Upd - before.Upd, HotUpd: after.HotUpd - before.HotUpd})
		r.seed++
		fanOut(ctx, conc, cfg.Samples, r.seed, func(rng *rand.Rand) { c.replayClaim(ctx, rng, rec) })
		r.seed++
		fanOut(ctx, conc, cfg.Samples, r.seed, func(rng *rand.Rand) { c.replayGet(ctx, rng, rec) })
		for _, op := range []string{OpClaimNew, OpComplete, OpReplayClaim, OpReplayGet} {
			l := rec.latency(op)
			st.Ops = append(st.Ops, OpResult{Op: op, Conc: conc, Latency: l})
			fmt.Fprintf(cfg.Progress, "%12d live  conc %-3d %-34s p50 %9v  p99 %9v  max %9v  errors %d\n",
				live, conc, op, l.P50.Round(time.Microsecond), l.P99.Round(time.Microsecond), l.Max.Round(time.Microsecond), l.Errors)
		}
		r.extra += int64(rec.latency(OpClaimNew).Samples)
		if err := ctx.Err(); err != nil {
			return st, err
		}
	}
	st.Sweep, _ = r.sweeper.sweepOnce(ctx, expired)
	fmt.Fprintf(cfg.Progress, "%12d live  sweeper deleted %d of %d expired rows in %v (%.0f rows/s), batch p50 %v p99 %v max %v\n",
		live, st.Sweep.Deleted, expired, st.Sweep.Took.Round(time.Millisecond), st.Sweep.RowsPerSecond(),
		st.Sweep.Batch.P50.Round(time.Microsecond), st.Sweep.Batch.P99.Round(time.Microsecond), st.Sweep.Batch.Max.Round(time.Microsecond))
	if st.Sweep.Error != "" {
		return st, fmt.Errorf("sweep: %s", st.Sweep.Error)
	}
	return st, ctx.Err()
}

// phase runs mixed load at the highest concurrency for cfg.Phase while the
// Sweeper sweeps a fresh batch of expired rows. The table's own autovacuum
// threshold is lowered (scale factor 0, threshold a quarter of the batch) so
// that, when the server's autovacuum is on, the sweeper's deletes bring the
// table's turn within the phase, as hours of sweeps would in production.
func (r *runner) phase(ctx context.Context) (Phase, error) {
	cfg := r.cfg
	ph := Phase{Live: r.live, Conc: slices.Max(cfg.Concurrency), Duration: cfg.Phase}
	if err := r.pool.QueryRow(ctx, "SHOW autovacuum").Scan(&ph.Autovacuum); err != nil {
		return ph, err
	}
	expired, _, err := r.loadExpired(ctx)
	if err != nil {
		return ph, err
	}
	ph.Expired = expired
	if _, err := r.vacuumAnalyze(ctx); err != nil {
		return ph, err
	}
	// On each partition, if any: a partitioned table takes no storage
	// parameters. The threshold is shared out among them.
	leaves, err := r.leaves(ctx)
	if err != nil {
		return ph, err
	}
	for _, t := range leaves {
		if _, err := r.pool.Exec(ctx, fmt.Sprintf("ALTER TABLE %s SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = %d)",
			t, max(expired/4/int64(len(leaves)), 1000))); err != nil {
			return ph, err
		}
	}
	defer func() {
		for _, t := range leaves {
			_, _ = r.pool.Exec(context.WithoutCancel(ctx), "ALTER TABLE "+t+" RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold)")
		}
	}()
	before, err := readStats(ctx, r.pool, r.table)
	if err != nil {
		return ph, err
	}
	ph.DeadBefore = before.Dead

	pctx, cancel := context.WithTimeout(ctx, cfg.Phase)
	defer cancel()
	deadline, _ := pctx.Deadline()
	var wg sync.WaitGroup
	// The sweeper sweeps until the batch is gone, then looks again every
	// second, as a Sweeper with a short Interval would.
	sweep := SweepResult{Expired: expired}
	var batches []time.Duration
	wg.Go(func() {
		for pctx.Err() == nil {
			s, b := r.sweeper.sweepOnce(pctx, 0)
			batches = append(batches, b...)
			if s.Error != "" && sweep.Error == "" {
				sweep.Error = s.Error
			}
			if s.Deleted == 0 {
				select {
				case <-pctx.Done():
				case <-time.After(time.Second):
				}
				continue
			}
			sweep.Deleted += s.Deleted
			sweep.Took += s.Took
		}
	})
	var vacSeconds atomic.Int64
	wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-t.C:
			}
			var n int
			err := r.pool.QueryRow(pctx, "SELECT count(*) FROM pg_stat_progress_vacuum WHERE relid IN ("+leavesSQL+")", r.table).Scan(&n)
			if err == nil && n > 0 {
				vacSeconds.Add(1)
			}
		}
	})
	rec := newRecorder()
	c := &client{store: r.store, live: r.live}
	var claims atomic.Int64
	for w := range ph.Conc {
		r.seed++
		seed := r.seed
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for i := 0; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				if i%2 == 0 {
					c.claimAndComplete(ctx, rng, rec)
					claims.Add(1)
				} else {
					c.replayClaim(ctx, rng, rec)
				}
			}
		})
	}
	wg.Wait()
	r.extra += claims.Load()
	for _, op := range []string{OpClaimNew, OpComplete, OpReplayClaim} {
		l := rec.latency(op)
		ph.Ops = append(ph.Ops, OpResult{Op: op, Conc: ph.Conc, Latency: l})
		fmt.Fprintf(cfg.Progress, "%12d live  phase autovacuum=%-3s conc %-3d %-34s p50 %9v  p99 %9v  max %9v  errors %d\n",
			r.live, ph.Autovacuum, ph.Conc, op, l.P50.Round(time.Microsecond), l.P99.Round(time.Microsecond), l.Max.Round(time.Microsecond), l.Errors)
	}
	sweep.Batch = summarize(batches, 0, "")
	ph.Sweep = sweep
	ph.AutovacuumSeconds = int(vacSeconds.Load())
	after, err := readStats(ctx, r.pool, r.table)
	if err != nil {
		return ph, err
	}
	ph.AutovacuumRuns = after.Autovacuums - before.Autovacuums
	ph.DeadAt = after.Dead
	fmt.Fprintf(cfg.Progress, "%12d live  phase autovacuum=%-3s sweeper deleted %d of %d in %v busy; autovacuum on the table %ds, %d runs finished\n",
		r.live, ph.Autovacuum, ph.Sweep.Deleted, expired, ph.Sweep.Took.Round(time.Millisecond), ph.AutovacuumSeconds, ph.AutovacuumRuns)
	return ph, ctx.Err()
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// leaves returns the names of the relations that hold the table's rows: the
// table, or its partitions.
func (r *runner) leaves(ctx context.Context) ([]string, error) {
	rows, err := r.pool.Query(ctx, "SELECT relid::regclass::text FROM ("+leavesSQL+") l", r.table)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
