// Package httpcmp measures the whole request over HTTP: `go run ./bench
// http` drives the minimal SQL (target.MinimalHandler), the guard's
// middleware as it runs by default, the same without shared statements
// (guard-unshared) and with asynchronous answers and no shared statements
// (guard-async, the guard before durable answers) and, with
// -baseline, the guard of another build of the bench, each in a worker
// process of its own on loopback, closed loop, with first executions
// (unique keys) and replays, at each caller count, every strategy's and
// implementation's worker in each round, in an order that alternates
// (ABBA). It reports the medians of the per-round ratios (between
// implementations, and hybrid ÷ table) with their spread, and per first
// execution the disk flushes
// (pg_stat_wal.wal_sync, server-wide) and the CPU of PostgreSQL and of the
// worker.
//
// The minimal SQL stands in for the strongest Go peer,
// github.com/repenguin22/idemlease, which the module proxy does not serve
// here (403).
package httpcmp

import (
	"cmp"
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/bench/internal/cli"
	"github.com/idemguard/idem/bench/internal/delayproxy"
	"github.com/idemguard/idem/bench/internal/fleet"
	"github.com/idemguard/idem/bench/internal/target"
)

// Implementations compared.
const (
	Minimal = "minimal" // target.MinimalHandler, this build
	Guard   = "guard"   // the guard's middleware, this build
	Before  = "before"  // the guard's middleware, the -baseline build
	// GuardAsync is this build's guard as it ran before durable answers and
	// shared commits: durable.Config.AsynchronousAnswers (the answer write
	// returns before its flush) and no shared statement.
	GuardAsync = "guard-async"
	// GuardUnshared is this build's guard whose store shares no statement
	// among requests (no group commit), every answer durable.
	GuardUnshared = "guard-unshared"
)

// maxPool caps a worker's pgx pool: a service's pool, not one connection per
// caller; past it callers wait for a connection.
const maxPool = 32

// Scenarios.
const (
	Unique  = "unique"  // every request a new key: first executions
	Replay  = "replay"  // every request a key answered before the run
	Retries = "retries" // 4 requests in 5 repeat one of the run's latest recentKeys answered keys
)

// recentKeys is how many of a retries run's latest answered keys its
// retries repeat.
const recentKeys = 128

// Run is one implementation's run in one round.
type Run struct {
	Strategy, Scenario, Impl string
	Callers, Round           int
	Requests, Errors         int64
	Executed                 int64 // 201 answers that were not replays
	Elapsed                  time.Duration
	WALSyncs                 int64 // pg_stat_wal.wal_sync delta, server-wide
	Commits                  int64 // pg_stat_database.xact_commit delta, the bench's database
	// WorkerCPU, PostgresCPU, RedisCPU and DriverCPU are the CPU seconds
	// the worker process, the PostgreSQL processes serving the fleet, the
	// Redis server and the bench process (the callers) used during the run
	// (fleet.Meter; 0 where /proc cannot be read, Redis's from INFO).
	WorkerCPU, PostgresCPU, RedisCPU, DriverCPU float64
	FirstErr                                    string
}

// OpsPerSec is answers without error per second.
func (r Run) OpsPerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests-r.Errors) / r.Elapsed.Seconds()
}

// PostgresMicrosPerRequest and WorkerMicrosPerRequest are the CPU of
// PostgreSQL and of the worker per answered request, in µs.
func (r Run) PostgresMicrosPerRequest() float64 { return r.perRequest(r.PostgresCPU) }

func (r Run) WorkerMicrosPerRequest() float64 { return r.perRequest(r.WorkerCPU) }

// RedisMicrosPerRequest is Redis's CPU per answered request, in µs.
func (r Run) RedisMicrosPerRequest() float64 { return r.perRequest(r.RedisCPU) }

// TotalMicrosPerRequest is the CPU of every part (the callers, the worker,
// PostgreSQL, Redis) per answered request, in µs: what throughput follows
// where the machine's cores bind.
func (r Run) TotalMicrosPerRequest() float64 {
	return r.perRequest(r.WorkerCPU + r.PostgresCPU + r.RedisCPU + r.DriverCPU)
}

func (r Run) perRequest(secs float64) float64 { return r.perAnswer(secs * 1e6) }

// CommitsPerRequest is transactions committed (statements, outside a
// caller's own transaction) per answered request.
func (r Run) CommitsPerRequest() float64 { return r.perAnswer(float64(r.Commits)) }

// perAnswer is x per answered request.
func (r Run) perAnswer(x float64) float64 {
	if n := r.Requests - r.Errors; n > 0 {
		return x / float64(n)
	}
	return 0
}

// FlushesPerExecution is wal_sync per first execution.
func (r Run) FlushesPerExecution() float64 {
	if r.Executed == 0 {
		return 0
	}
	return float64(r.WALSyncs) / float64(r.Executed)
}

type config struct {
	dbURL, redisAddr string
	callers          []int
	strategies       []string
	rounds           int
	run              time.Duration
	replayKeys       int
	settle           int      // requests of a run's scenario before it is measured
	impls            []string // what runs, Before last when there is a baseline
	scenarios        []string
	baseline         string
	pgDelay          time.Duration // added to each worker's PostgreSQL round trip
	profiles         string        // a directory for the workers' CPU profiles, or ""
	progress         io.Writer
}

// Command is `go run ./bench http [flags]`.
func Command(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("http", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: go run ./bench http [flags]\n\n"+
			"Compares the whole request over HTTP on loopback: the guard's middleware, the minimal SQL behind the\n"+
			"same HTTP path and, with -baseline, the guard of an earlier build; first executions, replays and retries,\n"+
			"closed loop, interleaved ABBA rounds; and disk flushes per first execution.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	dbURL, redisAddr := cli.ServerFlags(fs)
	settle := cli.SettleFlag(fs)
	var (
		callers    = fs.String("callers", "1,8,32", "closed-loop callers, comma-separated (each worker's pools get as many connections)")
		strategies = fs.String("strategies", "table,hybrid", "strategies")
		scenarios  = fs.String("scenarios", "unique,replay,retries", "scenarios: unique (first executions), replay, retries (80% repeat recent keys)")
		implsFlag  = fs.String("impls", strings.Join(allImpls, ","), "implementations (with -baseline, \"before\" too)")
		rounds     = fs.Int("rounds", 6, "ABBA rounds per caller count and scenario (at least 2)")
		runFor     = fs.Duration("run", 2*time.Second, "how long each implementation runs per round")
		replayKeys = fs.Int("replay-keys", 500, "keys answered before each replay run, which its requests repeat")
		baseline   = fs.String("baseline", "", "a bench binary of an earlier build whose guard runs as \"before\" (go build -o ... ./bench at that commit)")
		pgDelay    = fs.Duration("pg-delay", 0, "round-trip time added between the workers and PostgreSQL (a delay proxy), e.g. 500us")
		outDir     = fs.String("out", "bench-report-http", "report directory (created; its files replaced)")
		profiles   = fs.String("cpuprofile", "", "a directory where each worker of this build writes its CPU profile (STRATEGY-IMPL-CALLERS.pprof, all its rounds and scenarios), for go tool pprof")
	)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	cfg := config{dbURL: *dbURL, redisAddr: *redisAddr, strategies: cli.Split(*strategies), rounds: *rounds, run: *runFor,
		replayKeys: *replayKeys, settle: *settle, baseline: *baseline, pgDelay: *pgDelay, profiles: *profiles, progress: stdout, scenarios: cli.Split(*scenarios)}
	for _, impl := range cli.Split(*implsFlag) {
		if !slices.Contains(allImpls, impl) {
			fmt.Fprintf(stderr, "http: -impls: %q is none of %s\n", impl, strings.Join(allImpls, ", "))
			return 2
		}
		cfg.impls = append(cfg.impls, impl)
	}
	if cfg.baseline != "" {
		cfg.impls = append(cfg.impls, Before)
	}
	for _, s := range cli.Split(*callers) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			fmt.Fprintf(stderr, "http: -callers: %q is not a positive count\n", s)
			return 2
		}
		cfg.callers = append(cfg.callers, n)
	}
	if fs.NArg() > 0 || cfg.pgDelay < 0 || cfg.rounds < 2 || cfg.run <= 0 || cfg.replayKeys < 1 || cfg.settle < 0 || len(cfg.callers) == 0 ||
		len(cfg.impls) == 0 || len(cfg.strategies) == 0 || slices.ContainsFunc(cfg.strategies, func(s string) bool { return s != "table" && s != "hybrid" }) ||
		len(cfg.scenarios) == 0 || slices.ContainsFunc(cfg.scenarios, func(s string) bool { return !slices.Contains([]string{Unique, Replay, Retries}, s) }) {
		fmt.Fprintln(stderr, "http: need -rounds >= 2, a positive -run and -replay-keys, -settle >= 0, -callers, -impls, -strategies of table and hybrid and -scenarios of unique, replay and retries")
		return 2
	}
	started := time.Now()
	runs, err := sweep(ctx, cfg)
	interrupted := ctx.Err() != nil
	if err != nil && !interrupted {
		fmt.Fprintf(stderr, "http: %v\n", err)
		return 1
	}
	var b strings.Builder
	markdown(&b, cfg, runs, cli.CommandLine("go run ./bench http", fs), started, interrupted)
	fmt.Fprint(stdout, "\n"+b.String())
	if err := write(*outDir, b.String(), runs); err != nil {
		fmt.Fprintf(stderr, "http: writing the report: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "\nreport: %s/report.md (also runs.csv)\n", *outDir)
	if interrupted {
		return 130
	}
	return 0
}

func sweep(ctx context.Context, cfg config) ([]Run, error) {
	if cfg.profiles != "" {
		if err := os.MkdirAll(cfg.profiles, 0o755); err != nil {
			return nil, err
		}
	}
	env, err := target.Open(ctx, target.Config{DatabaseURL: cfg.dbURL, RedisAddr: cfg.redisAddr, PoolSize: 2})
	if err != nil {
		return nil, err
	}
	defer env.Close(context.WithoutCancel(ctx))
	meter := fleet.NewMeter(cfg.redisAddr, env.Pool, env.Schema)
	defer meter.Close()
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	workerURL := cfg.dbURL
	if cfg.pgDelay > 0 {
		var proxy *delayproxy.Process
		if proxy, workerURL, err = delayproxy.Between(ctx, self, cfg.dbURL, cfg.pgDelay); err != nil {
			return nil, err
		}
		defer proxy.Close()
	}
	var runs []Run
	var seq atomic.Int64
	fmt.Fprintf(cfg.progress, "%-7s %-8s %7s %5s %-12s %9s %8s %8s %8s %8s %8s %8s %7s\n", "strategy", "scenario", "callers", "round", "impl", "ops/s", "flush/ex", "xact/req", "pgµs/req", "wkµs/req", "rdµs/req", "allµs/rq", "errors")
	// Every strategy's workers run interleaved in each round, so that the
	// strategies are compared as the implementations are.
	type worker struct{ strategy, impl string }
	var workers []worker
	for _, st := range cfg.strategies {
		for _, impl := range cfg.impls {
			workers = append(workers, worker{st, impl})
		}
	}
	for _, conc := range cfg.callers {
		fleets := map[worker]*fleet.Fleet{}
		closeAll := func() {
			for _, f := range fleets {
				_ = f.Close()
			}
		}
		for _, w := range workers {
			fc := fleet.Config{Binary: self, DatabaseURL: workerURL, RedisAddr: cfg.redisAddr, Schema: env.Schema,
				Prefix: env.Prefix, Strategy: w.strategy, PoolSize: min(conc, maxPool), RedisPoolSize: conc, MaxInFlight: conc}
			switch w.impl {
			case Minimal:
				fc.Minimal = true
			case GuardAsync:
				fc.AsyncAnswers, fc.Unshared = true, true
			case GuardUnshared:
				fc.Unshared = true
			case Before:
				fc.Binary = cfg.baseline
			}
			if cfg.profiles != "" && w.impl != Before {
				fc.CPUProfile = filepath.Join(cfg.profiles, fmt.Sprintf("%s-%s-%d.pprof", w.strategy, w.impl, conc))
			}
			f, err := fleet.Start(ctx, fc, 1)
			if err != nil {
				closeAll()
				return runs, fmt.Errorf("%s %s worker: %w", w.strategy, w.impl, err)
			}
			fleets[w] = f
		}
		for _, w := range workers { // dial the pools, load the scripts
			if _, err := runOne(ctx, env, meter, fleets[w], w.impl, Unique, conc, cfg.run/4, cfg.replayKeys, 0, &seq); err != nil {
				closeAll()
				return runs, err
			}
		}
		for round := range cfg.rounds {
			order := slices.Clone(workers)
			if round%2 == 1 {
				slices.Reverse(order)
			}
			for _, sc := range cfg.scenarios {
				for _, w := range order {
					r, err := runOne(ctx, env, meter, fleets[w], w.impl, sc, conc, cfg.run, cfg.replayKeys, cfg.settle, &seq)
					if err != nil {
						closeAll()
						return runs, err
					}
					r.Strategy, r.Scenario, r.Impl, r.Callers, r.Round = w.strategy, sc, w.impl, conc, round+1
					runs = append(runs, r)
					fmt.Fprintf(cfg.progress, "%-7s %-8s %7d %5d %-12s %9.0f %8.3f %8.3f %8.0f %8.0f %8.0f %8.0f %7d\n",
						w.strategy, sc, conc, round+1, w.impl, r.OpsPerSec(), r.FlushesPerExecution(), r.CommitsPerRequest(),
						r.PostgresMicrosPerRequest(), r.WorkerMicrosPerRequest(), r.RedisMicrosPerRequest(),
						r.TotalMicrosPerRequest(), r.Errors)
				}
			}
		}
		closeAll()
	}
	return runs, nil
}

// settledCounts makes the worker's connections publish their statistics
// (POST /stats), gives the WAL writer one cycle (wal_writer_delay, 200ms by
// default) to publish its own, and reads the server's counters.
func settledCounts(ctx context.Context, env *target.Env, f *fleet.Fleet) (pgCounts, error) {
	if err := f.FlushStats(ctx); err != nil {
		return pgCounts{}, err
	}
	t := time.NewTimer(250 * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return pgCounts{}, ctx.Err()
	}
	for _, conn := range env.Pool.AcquireAllIdle(ctx) {
		_, _ = conn.Exec(ctx, "SELECT pg_stat_force_next_flush()")
		conn.Release()
	}
	return serverCounts(ctx, env)
}

// allImpls are what a run may compare: the minimal SQL, this build's guard
// (durable answers, group commit), the same without group commit, and the
// guard before durable answers (asynchronous, unshared); a baseline adds
// Before.
var allImpls = []string{Minimal, Guard, GuardUnshared, GuardAsync}

// pgCounts are the server's counters a run reads before and after: WAL
// flushes (server-wide) and commits (the bench's database).
type pgCounts struct{ walSyncs, commits int64 }

func serverCounts(ctx context.Context, env *target.Env) (pgCounts, error) {
	var c pgCounts
	err := env.Pool.QueryRow(ctx, `SELECT (SELECT wal_sync FROM pg_stat_wal),
	(SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())`).Scan(&c.walSyncs, &c.commits)
	return c, err
}

// counts are what a run's callers got.
type counts struct {
	requests, errs, executed atomic.Int64
	errOnce                  sync.Once
	firstErr                 string
}

// runOne resets impl's table (target.Env.Reset) and, for replays, answers replayKeys keys
// first; then runs conc callers closed loop for settle requests (see
// cli.SettleFlag), and measures them for d.
func runOne(ctx context.Context, env *target.Env, meter *fleet.Meter, f *fleet.Fleet, impl, scenario string, conc int, d time.Duration,
	replayKeys, settle int, seq *atomic.Int64) (Run, error) {
	var r Run
	table := target.GuardTable
	if impl == Minimal {
		table = target.MinimalTable
	}
	if err := env.Reset(ctx, table); err != nil {
		return r, err
	}
	key := func(k int64) (string, string) {
		return "h" + strconv.FormatInt(k, 36), "user-" + strconv.FormatInt(k%1000, 10)
	}
	var keys []int64
	if scenario == Replay {
		// Answered by as many callers as the run has, so that preparing
		// costs about what it would at that concurrency.
		keys = make([]int64, replayKeys)
		for i := range keys {
			keys[i] = seq.Add(1)
		}
		var (
			next    atomic.Int64
			prepErr error
			once    sync.Once
			wg      sync.WaitGroup
		)
		for range conc {
			wg.Go(func() {
				for i := next.Add(1) - 1; i < int64(len(keys)); i = next.Add(1) - 1 {
					kk, scope := key(keys[i])
					if out, err := f.Post(ctx, 0, kk, scope); err != nil || out != idem.OutcomeExecuted.String() {
						once.Do(func() { prepErr = fmt.Errorf("%s: preparing a replay: %s %v", impl, out, err) })
						return
					}
				}
			})
		}
		wg.Wait()
		if prepErr != nil {
			return r, prepErr
		}
	}
	var (
		answered atomic.Int64
		recent   [recentKeys]atomic.Int64 // the latest answered keys, a ring
	)
	// drive runs conc callers closed loop until stop says so, and counts
	// what they get into c.
	drive := func(c *counts, stop func() bool) {
		var wg sync.WaitGroup
		seed := uint64(time.Now().UnixNano())
		for caller := range conc {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(caller), seed))
				for ctx.Err() == nil && !stop() {
					k, want := int64(0), idem.OutcomeReplayed.String()
					switch n := answered.Load(); {
					case scenario == Replay:
						k = keys[rng.IntN(len(keys))]
					case scenario == Retries && n > 0 && rng.IntN(5) < 4:
						k = recent[rng.Int64N(min(n, recentKeys))].Load()
					}
					if k == 0 {
						k, want = seq.Add(1), idem.OutcomeExecuted.String()
					}
					kk, scope := key(k)
					out, err := f.Post(ctx, 0, kk, scope)
					c.requests.Add(1)
					if err == nil && out != want {
						err = fmt.Errorf("%s: outcome %s, want %s", impl, out, want)
					}
					if err != nil {
						c.errs.Add(1)
						c.errOnce.Do(func() { c.firstErr = err.Error() })
						continue
					}
					if out == idem.OutcomeExecuted.String() {
						c.executed.Add(1)
						recent[(answered.Add(1)-1)%recentKeys].Store(k)
					}
				}
			})
		}
		wg.Wait()
	}
	var warm counts
	drive(&warm, func() bool { return warm.requests.Load() >= int64(settle) })
	w0, err := settledCounts(ctx, env, f)
	if err != nil {
		return r, err
	}
	var c counts
	cpu0 := meter.Read(ctx, f)
	start := time.Now()
	deadline := start.Add(d)
	drive(&c, func() bool { return time.Now().After(deadline) })
	r.Elapsed = time.Since(start)
	u := fleet.Between(cpu0, meter.Read(ctx, f))
	secs := r.Elapsed.Seconds()
	r.WorkerCPU, r.PostgresCPU, r.RedisCPU, r.DriverCPU = u.Workers*secs, u.Postgres*secs, u.Redis*secs, u.Driver*secs
	w1, err := settledCounts(ctx, env, f)
	if err != nil {
		return r, err
	}
	// The settling requests' errors count too: they were answered wrong.
	r.Requests, r.Errors, r.Executed = c.requests.Load(), c.errs.Load()+warm.errs.Load(), c.executed.Load()
	r.FirstErr = cmp.Or(warm.firstErr, c.firstErr)
	r.WALSyncs, r.Commits = w1.walSyncs-w0.walSyncs, w1.commits-w0.commits
	return r, ctx.Err()
}

// ratio is the median, lowest and highest over the rounds of a ÷ b, each
// round's two runs paired.
type ratio struct{ median, low, high float64 }

func ratios(runs []Run, strategy, scenario string, conc int, a, b string, metric func(Run) float64) (ratio, bool) {
	return pairRounds(runs, match(strategy, scenario, conc, a), match(strategy, scenario, conc, b), metric)
}

// strategyRatios is ratios across strategies: hybrid ÷ table for impl.
func strategyRatios(runs []Run, scenario string, conc int, impl string) (ratio, bool) {
	return pairRounds(runs, match("hybrid", scenario, conc, impl), match("table", scenario, conc, impl), Run.OpsPerSec)
}

func match(strategy, scenario string, conc int, impl string) func(Run) bool {
	return func(r Run) bool {
		return r.Strategy == strategy && r.Scenario == scenario && r.Callers == conc && r.Impl == impl
	}
}

// pairRounds pairs, round by round, the run a matches with the one b
// matches, and returns the median, lowest and highest of their metrics'
// ratio a ÷ b.
func pairRounds(runs []Run, a, b func(Run) bool, metric func(Run) float64) (ratio, bool) {
	byRound := map[int][2]float64{}
	for _, r := range runs {
		p := byRound[r.Round]
		switch {
		case a(r):
			p[0] = metric(r)
		case b(r):
			p[1] = metric(r)
		default:
			continue
		}
		byRound[r.Round] = p
	}
	var xs []float64
	for _, p := range byRound {
		if p[0] > 0 && p[1] > 0 {
			xs = append(xs, p[0]/p[1])
		}
	}
	if len(xs) == 0 {
		return ratio{}, false
	}
	return ratio{cli.Median(xs), slices.Min(xs), slices.Max(xs)}, true
}

// present keeps the pairs whose two implementations both run.
func present(impls []string, pairs ...[2]string) [][2]string {
	var out [][2]string
	for _, p := range pairs {
		if slices.Contains(impls, p[0]) && slices.Contains(impls, p[1]) {
			out = append(out, p)
		}
	}
	return out
}

func medianOf(runs []Run, strategy, scenario, impl string, conc int, metric func(Run) float64) float64 {
	var xs []float64
	for _, r := range runs {
		if r.Strategy == strategy && r.Scenario == scenario && r.Callers == conc && r.Impl == impl {
			xs = append(xs, metric(r))
		}
	}
	return cli.Median(xs)
}

func markdown(w io.Writer, cfg config, runs []Run, command string, started time.Time, interrupted bool) {
	fmt.Fprintf(w, "# The whole request over HTTP\n\n")
	if interrupted {
		fmt.Fprintf(w, "**Interrupted**: only the runs that ended are reported.\n\n")
	}
	fmt.Fprintf(w, "Command: `%s`  \nStarted %s, took %s. One worker process per implementation on loopback, "+
		"its Redis pool as large as the callers and its pgx pool too, up to %d; PostgreSQL %v further than loopback; no handler latency; %d ABBA rounds of %v, each run after %d requests of its scenario that are not measured "+
		"(the lease and insert modes settle); replays repeat %d keys answered before each run. Flushes are pg_stat_wal.wal_sync, server-wide (other clients of the server count too), "+
		"per first execution.\n\n", command, started.UTC().Format(time.RFC3339), time.Since(started).Round(time.Second),
		maxPool, cfg.pgDelay, cfg.rounds, cfg.run, cfg.settle, cfg.replayKeys)
	impls := cfg.impls
	// header writes a table's header: the first columns, then one per
	// implementation (suffixed) and per pair of them.
	header := func(first, align, suffix string, pairs [][2]string) {
		fmt.Fprintf(w, "| %s |", first)
		for _, impl := range impls {
			fmt.Fprintf(w, " %s%s |", impl, suffix)
		}
		for _, p := range pairs {
			fmt.Fprintf(w, " %s ÷ %s |", p[0], p[1])
		}
		fmt.Fprintf(w, "\n|%s%s%s\n", align, strings.Repeat("---:|", len(impls)), strings.Repeat("---|", len(pairs)))
	}
	cell := func(x ratio, ok bool) {
		if ok {
			fmt.Fprintf(w, " %.2f (%.2f–%.2f) |", x.median, x.low, x.high)
		} else {
			fmt.Fprintf(w, " - |")
		}
	}
	pairs := present(impls, [2]string{Guard, Minimal}, [2]string{Guard, GuardUnshared}, [2]string{Guard, GuardAsync},
		[2]string{Guard, Before}, [2]string{Before, Minimal})
	header("strategy | scenario | callers", "---|---|---:|", " ops/s", pairs)
	for _, st := range cfg.strategies {
		for _, sc := range cfg.scenarios {
			for _, conc := range cfg.callers {
				fmt.Fprintf(w, "| %s | %s | %d |", st, sc, conc)
				for _, impl := range impls {
					fmt.Fprintf(w, " %.0f |", medianOf(runs, st, sc, impl, conc, Run.OpsPerSec))
				}
				for _, p := range pairs {
					cell(ratios(runs, st, sc, conc, p[0], p[1], Run.OpsPerSec))
				}
				fmt.Fprintln(w)
			}
		}
	}
	fmt.Fprintf(w, "\nDisk flushes per first execution (median of the rounds; ratio: median of the rounds' ratios):\n\n")
	flushPairs := present(impls, [2]string{Guard, GuardUnshared}, [2]string{Guard, GuardAsync}, [2]string{Guard, Before})
	header("strategy | callers", "---|---:|", "", flushPairs)
	for _, st := range cfg.strategies {
		for _, conc := range cfg.callers {
			fmt.Fprintf(w, "| %s | %d |", st, conc)
			for _, impl := range impls {
				fmt.Fprintf(w, " %.3f |", medianOf(runs, st, Unique, impl, conc, Run.FlushesPerExecution))
			}
			for _, p := range flushPairs {
				cell(ratios(runs, st, Unique, conc, p[0], p[1], Run.FlushesPerExecution))
			}
			fmt.Fprintln(w)
		}
	}
	fmt.Fprintf(w, "\nCPU per request, µs, PostgreSQL / worker process / Redis / all (the callers too), median of the rounds "+
		"(a unique run's requests are first executions):\n\n")
	header("strategy | scenario | callers", "---|---|---:|", "", nil)
	for _, st := range cfg.strategies {
		for _, sc := range cfg.scenarios {
			for _, conc := range cfg.callers {
				fmt.Fprintf(w, "| %s | %s | %d |", st, sc, conc)
				for _, impl := range impls {
					fmt.Fprintf(w, " %.0f / %.0f / %.0f / %.0f |", medianOf(runs, st, sc, impl, conc, Run.PostgresMicrosPerRequest),
						medianOf(runs, st, sc, impl, conc, Run.WorkerMicrosPerRequest), medianOf(runs, st, sc, impl, conc, Run.RedisMicrosPerRequest),
						medianOf(runs, st, sc, impl, conc, Run.TotalMicrosPerRequest))
				}
				fmt.Fprintln(w)
			}
		}
	}
	if slices.Contains(cfg.strategies, "table") && slices.Contains(cfg.strategies, "hybrid") {
		fmt.Fprintf(w, "\nhybrid ÷ table, ops/s (each round's two runs paired; median, lowest–highest):\n\n")
		header("scenario | callers", "---|---:|", "", nil)
		for _, sc := range cfg.scenarios {
			for _, conc := range cfg.callers {
				fmt.Fprintf(w, "| %s | %d |", sc, conc)
				for _, impl := range impls {
					cell(strategyRatios(runs, sc, conc, impl))
				}
				fmt.Fprintln(w)
			}
		}
	}
	var errs int64
	for _, r := range runs {
		errs += r.Errors
	}
	fmt.Fprintf(w, "\nErrors over all runs: %d. Every run is in runs.csv.\n", errs)
}

func write(dir, md string, runs []Run) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(md), 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "runs.csv"))
	if err != nil {
		return err
	}
	cw := csv.NewWriter(f)
	_ = cw.Write([]string{"strategy", "scenario", "impl", "callers", "round", "requests", "errors", "executed", "elapsed_s", "ops_per_s", "wal_sync", "xact_commit", "worker_cpu_s", "postgres_cpu_s", "redis_cpu_s", "driver_cpu_s", "first_error"})
	for _, r := range runs {
		_ = cw.Write([]string{r.Strategy, r.Scenario, r.Impl, strconv.Itoa(r.Callers), strconv.Itoa(r.Round),
			strconv.FormatInt(r.Requests, 10), strconv.FormatInt(r.Errors, 10), strconv.FormatInt(r.Executed, 10),
			strconv.FormatFloat(r.Elapsed.Seconds(), 'f', 3, 64), strconv.FormatFloat(r.OpsPerSec(), 'f', 1, 64),
			strconv.FormatInt(r.WALSyncs, 10), strconv.FormatInt(r.Commits, 10), strconv.FormatFloat(r.WorkerCPU, 'f', 3, 64),
			strconv.FormatFloat(r.PostgresCPU, 'f', 3, 64), strconv.FormatFloat(r.RedisCPU, 'f', 3, 64),
			strconv.FormatFloat(r.DriverCPU, 'f', 3, 64), r.FirstErr})
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
