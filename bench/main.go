// Command bench is idem's capacity planner: it drives the real Guard, in
// process, against a real PostgreSQL and Redis with open-loop arrivals, steps
// the offered rate up until each strategy saturates, runs the same SQL
// statements and Redis commands without the guard as a ceiling and the least
// SQL that does the job on the least schema as a minimal target, measures
// the run's noise from repeated identical steps, and writes a report
// (report.md, results.csv, p99.png, throughput.png).
//
// From the repository root:
//
//	go run ./bench                       # a few minutes, defaults below
//	go run ./bench -step 10s -rate-max 32000 -work 50ms -out /tmp/capacity
//
// or, installed with go install github.com/idemguard/idem/bench@latest, as
// bench with the same flags.
//
// It works in a schema (idem_bench_<random>) and under a Redis prefix
// (idembench:<random>:) of its own, both removed at the end, so it never
// touches an application's data. Ctrl-C stops it after the current step and
// still writes the report of what ran.
//
// See bench/README.md for what each figure means.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemguard/idem/bench/internal/bigtable"
	"github.com/idemguard/idem/bench/internal/cli"
	"github.com/idemguard/idem/bench/internal/crossover"
	"github.com/idemguard/idem/bench/internal/delayproxy"
	"github.com/idemguard/idem/bench/internal/fleet"
	"github.com/idemguard/idem/bench/internal/httpcmp"
	"github.com/idemguard/idem/bench/internal/load"
	"github.com/idemguard/idem/bench/internal/plan"
	"github.com/idemguard/idem/bench/internal/report"
	"github.com/idemguard/idem/bench/internal/target"
)

const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

func main() {
	if fleet.IsWorker() { // -instances re-runs this binary as its workers
		os.Exit(fleet.Serve(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C kills at once
	}()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// run is the command with its arguments; it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "bigtable": // the big-table bench: go run ./bench bigtable -h
			return bigtable.Command(ctx, args[1:], stdout, stderr)
		case "crossover": // the retry-share and distance sweep: go run ./bench crossover -h
			return crossover.Command(ctx, args[1:], stdout, stderr)
		case "http": // the whole request over HTTP against the minimal SQL: go run ./bench http -h
			return httpcmp.Command(ctx, args[1:], stdout, stderr)
		case "delayproxy": // run by crossover as its delay proxy
			return delayproxy.Command(args[1:], os.Stdin, stdout, stderr)
		}
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: go run ./bench [flags]\n\n"+
			"Capacity planner of idem: drives the guard (table and hybrid strategies), the ceiling of its\n"+
			"bare statements and the minimal SQL with open-loop load against PostgreSQL and Redis, and\n"+
			"writes a report.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	var (
		dbURL      = fs.String("database-url", envOr("DATABASE_URL", defaultDatabaseURL), "PostgreSQL URL (default $DATABASE_URL, else the local default)")
		redisAddr  = fs.String("redis-addr", envOr("REDIS_ADDR", "127.0.0.1:6379"), "Redis address (default $REDIS_ADDR, else the local default)")
		stepDur    = fs.Duration("step", time.Second, "how long each step offers its rate")
		drain      = fs.Duration("drain", 0, "extra time per step for late arrivals and requests in flight (0: the step's duration)")
		warmup     = fs.Duration("warmup", 300*time.Millisecond, "warm-up per target before the first step (0: none)")
		ratesFlag  = fs.String("rates", "", "offered rates in req/s, comma-separated, ascending; overrides -rate-start/-rate-factor/-rate-max")
		rateStart  = fs.Float64("rate-start", 500, "first offered rate in req/s")
		rateFactor = fs.Float64("rate-factor", 2, "factor between offered rates")
		rateMax    = fs.Float64("rate-max", 8000, "highest offered rate in req/s")
		inflight   = fs.Int("max-inflight", 256, "most requests in flight; arrivals beyond wait, and the wait counts in their latency")
		poolSize   = fs.Int("pool-size", 16, "pgx pool size (MaxConns)")
		redisPool  = fs.Int("redis-pool-size", 0, "go-redis pool size (0: go-redis' default, 10 per GOMAXPROCS)")
		work       = fs.Duration("work", 5*time.Millisecond, "simulated handler latency (the guarded work)")
		dup        = fs.Float64("dup", 0.2, "share of retries in the mix scenario, in [0, (K-1)/K]")
		stormK     = fs.Int("storm-k", 5, "retry storm size K: copies of each intent")
		stormWin   = fs.Duration("storm-window", 20*time.Millisecond, "window over which a storm's K copies are spread")
		scenarios  = fs.String("scenarios", "unique,storm,mix", "scenarios: unique (every request a new intent), storm (every intent K times), mix (-dup retries)")
		strategies = fs.String("strategies", "table,hybrid", "strategies: table, hybrid")
		ceiling    = fs.Bool("ceiling", true, "also run the ceiling: the same statements and commands without the guard")
		minimal    = fs.Bool("minimal", true, "also run the minimal target: the least SQL that does the job, on a minimal table")
		noiseRuns  = fs.Int("noise-runs", 3, "identical runs per target of the first scenario's lowest rate, to measure the noise (below 2: none)")
		p99Limit   = fs.Duration("p99-limit", 250*time.Millisecond, "a step whose p99 exceeds this is saturated (0: no limit)")
		instances  = fs.String("instances", "", "many instances: run the guard in this many worker processes, e.g. 1,2,4 (each count in turn, the pgx pool divided among them) instead of in process")
		outDir     = fs.String("out", "bench-report", "report directory (created; files in it are replaced)")
	)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bench: unexpected arguments %q\n", fs.Args())
		return 2
	}
	rates, err := offeredRates(*ratesFlag, *rateStart, *rateFactor, *rateMax)
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 2
	}
	counts, err := instanceCounts(*instances)
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 2
	}
	if *drain == 0 {
		*drain = *stepDur
	}
	cfg := plan.Config{
		Target: target.Config{
			DatabaseURL:   *dbURL,
			RedisAddr:     *redisAddr,
			PoolSize:      *poolSize,
			RedisPoolSize: *redisPool,
		},
		Step:        *stepDur,
		Drain:       *drain,
		Warmup:      *warmup,
		Rates:       rates,
		MaxInFlight: *inflight,
		Work:        *work,
		Dup:         *dup,
		StormK:      *stormK,
		StormWindow: *stormWin,
		Scenarios:   cli.Split(*scenarios),
		Strategies:  cli.Split(*strategies),
		NoCeiling:   !*ceiling,
		NoMinimal:   !*minimal,
		NoiseRuns:   *noiseRuns,
		Instances:   counts,
		Limits:      load.Limits{MaxP99: *p99Limit},
		Command:     cli.CommandLine("go run ./bench", fs),
		Progress:    stdout,
	}
	rep, err := plan.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 1
	}
	if len(rep.Instances) > 0 {
		rep.WriteInstancesSummary(stdout)
	} else {
		summary(stdout, rep)
	}
	if err := report.Write(*outDir, rep); err != nil {
		fmt.Fprintf(stderr, "bench: writing the report: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "\nreport: %s/%s (also %s)\n", *outDir, report.MarkdownFile, strings.Join(rep.Files(), ", "))
	if rep.Setup.Interrupted {
		return 130
	}
	return 0
}

// instanceCounts parses -instances: positive, ascending counts.
func instanceCounts(list string) ([]int, error) {
	var out []int
	for _, s := range cli.Split(list) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-instances: %q is not a positive count", s)
		}
		if len(out) > 0 && n <= out[len(out)-1] {
			return nil, fmt.Errorf("-instances: %v must be ascending", list)
		}
		out = append(out, n)
	}
	return out, nil
}

// offeredRates returns the list given, or start, start*factor, ... up to max.
func offeredRates(list string, start, factor, maxRate float64) ([]float64, error) {
	if list != "" {
		var out []float64
		for _, s := range cli.Split(list) {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil || !(v > 0) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("-rates: %q is not a positive number", s)
			}
			if len(out) > 0 && v <= out[len(out)-1] {
				return nil, fmt.Errorf("-rates: %v must be ascending", list)
			}
			out = append(out, v)
		}
		return out, nil
	}
	if !(start > 0) || !(factor > 1) || maxRate < start {
		return nil, fmt.Errorf("-rate-start %v, -rate-factor %v, -rate-max %v: need start > 0, factor > 1, max >= start", start, factor, maxRate)
	}
	var out []float64
	for r := start; r <= maxRate*1.000001; r *= factor {
		out = append(out, math.Round(r))
	}
	return out, nil
}

// summary prints the final summary: the overhead ratios, the noise and the
// answer.
func summary(w io.Writer, rep *report.Report) {
	fmt.Fprintln(w)
	if rep.Setup.Interrupted {
		fmt.Fprintln(w, "INTERRUPTED: summary of the steps that ran")
	}
	fmt.Fprintf(w, "summary (%s): peaks in req/s, g/c = guard / ceiling (Go overhead), c/m = ceiling / minimal (SQL and schema)\n",
		rep.Setup.Finished.Sub(rep.Setup.Started).Round(time.Second))
	fmt.Fprintf(w, "%-8s %-7s %8s %8s %8s %6s %6s %8s %9s %9s %9s %6s %6s\n",
		"scenario", "strategy", "guard", "ceiling", "minimal", "g/c", "c/m", "at req/s", "guard p99", "ceil p99", "min p99", "g/c", "c/m")
	mark := func(sat bool) string {
		if sat {
			return "*"
		}
		return " "
	}
	num := func(v float64, prec int) string {
		if v == 0 {
			return "-"
		}
		return strconv.FormatFloat(v, 'f', prec, 64)
	}
	dur := func(d time.Duration) string {
		if d == 0 {
			return "-"
		}
		return d.Round(10 * time.Microsecond).String()
	}
	for _, o := range rep.Overheads() {
		fmt.Fprintf(w, "%-8s %-7s %7.0f%s %7.0f%s %7s%s %6s %6s %8s %9s %9s %9s %6s %6s\n",
			o.Scenario, o.Strategy, o.GuardPeak, mark(o.GuardSaturated), o.CeilingPeak, mark(o.CeilingSaturated),
			num(o.MinimalPeak, 0), mark(o.MinimalSaturated), num(o.ThroughputRatio, 2), num(o.MinimalRatio, 2),
			num(o.At, 0), dur(o.GuardP99), dur(o.CeilingP99), dur(o.MinimalP99), num(o.P99Ratio, 2), num(o.MinimalP99Ratio, 2))
	}
	fmt.Fprintln(w, "(* saturated: the peak is that ladder's capacity; otherwise it kept up with every offered rate.")
	fmt.Fprintln(w, " p99s at the highest offered rate no ladder of the strategy saturated. Targets: both throughput")
	fmt.Fprintln(w, " ratios >= 0.9 at 8 and 32 closed-loop callers, measured by BenchmarkThroughput)")
	noise := rep.Noise()
	if noise.Pairs > 0 {
		fmt.Fprintf(w, "noise: p99 of identical runs differ by up to %.0f%% (90th percentile of %d pairs at %.0f req/s of %s)\n",
			100*noise.Threshold, noise.Pairs, noise.Offered, noise.Scenario)
	} else {
		fmt.Fprintf(w, "noise: not measured (no repeated steps); %.0f%% assumed\n", 100*noise.Threshold)
	}
	fmt.Fprintln(w)
	for _, v := range rep.Answer() {
		fmt.Fprintln(w, "answer: "+v.Text())
	}
}
