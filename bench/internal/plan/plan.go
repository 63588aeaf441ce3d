// Package plan runs the capacity planner's ladders: for every scenario and
// offered rate, a step of each strategy's guard, of its ceiling and of the
// minimal SQL, until each ladder saturates. Before the ladders it repeats
// one identical step per target to measure the run's noise. It prints a
// progress line per step and returns the report of what ran, also when
// interrupted.
package plan

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/bench/internal/load"
	"github.com/idemguard/idem/bench/internal/report"
	"github.com/idemguard/idem/bench/internal/target"
)

// Scenario names.
const (
	Unique = "unique"
	Storm  = "storm"
	Mix    = "mix"
)

// Config is a run of the planner. Every field is required unless it says
// otherwise; cmd/bench's flags document the defaults.
type Config struct {
	Target      target.Config
	Step        time.Duration // time each step schedules arrivals
	Drain       time.Duration // extra time for late arrivals and requests in flight
	Warmup      time.Duration // per target, before the first step; 0 for none
	Rates       []float64     // offered rates, ascending
	MaxInFlight int
	Work        time.Duration // simulated handler latency
	Dup         float64       // share of retries in the mix scenario
	StormK      int           // copies per intent in storms
	StormWindow time.Duration // window a storm's copies are spread over
	Scenarios   []string      // of Unique, Storm, Mix
	Strategies  []string      // of target.Table, target.Hybrid
	NoCeiling   bool          // skip the ceiling's ladders
	NoMinimal   bool          // skip the minimal's ladders
	NoiseRuns   int           // identical runs per target before the ladders (report.Report.Noise); below 2, none
	// Instances, when set, makes the run a many-instance one: the guard of
	// each strategy in that many worker processes (each count in turn),
	// driven over HTTP, instead of the in-process ladders, ceiling, minimal
	// and noise runs. The pgx pool (Target.PoolSize) is divided among the
	// workers. The bench binary must call fleet.Serve when fleet.IsWorker.
	Instances []int
	Limits    load.Limits
	Command   string    // the command line, for the report
	Progress  io.Writer // progress lines; nil for none
}

func (c *Config) validate() error {
	switch {
	case c.Step <= 0:
		return fmt.Errorf("step %v must be positive", c.Step)
	case len(c.Rates) == 0:
		return errors.New("no offered rates")
	case c.MaxInFlight < 1:
		return fmt.Errorf("max in flight %d must be positive", c.MaxInFlight)
	case c.StormK < 2:
		return fmt.Errorf("storm size K %d must be at least 2", c.StormK)
	case c.Dup < 0 || c.Dup >= 1:
		return fmt.Errorf("duplicate share %v must be in [0, 1)", c.Dup)
	case len(c.Scenarios) == 0 || len(c.Strategies) == 0:
		return errors.New("no scenario or no strategy")
	case c.NoiseRuns < 0:
		return fmt.Errorf("noise runs %d must not be negative", c.NoiseRuns)
	}
	for i, r := range c.Rates {
		if !(r > 0) || (i > 0 && r <= c.Rates[i-1]) {
			return fmt.Errorf("offered rates %v must be positive and ascending", c.Rates)
		}
	}
	for _, s := range c.Scenarios {
		if s != Unique && s != Storm && s != Mix {
			return fmt.Errorf("unknown scenario %q (want unique, storm or mix)", s)
		}
	}
	for _, n := range c.Instances {
		if n < 1 {
			return fmt.Errorf("instance count %d must be positive", n)
		}
	}
	for _, s := range c.Strategies {
		if s != target.Table && s != target.Hybrid {
			return fmt.Errorf("unknown strategy %q (want table or hybrid)", s)
		}
	}
	return nil
}

func (c *Config) pattern(scenario string, rate float64) load.Pattern {
	switch scenario {
	case Storm:
		return load.Storm(c.StormK, c.StormWindow, rate)
	case Mix:
		return load.Mix(c.Dup, c.StormK, c.StormWindow, rate)
	}
	return load.Unique()
}

func (c *Config) impls() []string {
	impls := []string{target.Guard}
	if !c.NoCeiling {
		impls = append(impls, target.Ceiling)
	}
	if !c.NoMinimal {
		impls = append(impls, target.Minimal)
	}
	return impls
}

// alternate returns the indexes of n targets in order for even rounds and in
// reverse for odd ones (ABBA), so that no target always runs first or right
// after the same other one.
func alternate(n, round int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	if round%2 == 1 {
		slices.Reverse(idx)
	}
	return idx
}

// Run opens a fresh bench schema and Redis prefix, runs the ladders and
// removes both. It returns the report of every step that ran: on ctx's end
// (Ctrl-C) it stops after the current step and returns what it has, with
// Setup.Interrupted set, and a nil error.
func Run(ctx context.Context, cfg Config) (*report.Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	out := cfg.Progress
	if out == nil {
		out = io.Discard
	}
	env, err := target.Open(ctx, cfg.Target)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := env.Close(context.WithoutCancel(ctx)); err != nil {
			fmt.Fprintf(out, "cleanup: %v\n", err)
		}
	}()

	rep := &report.Report{Setup: setup(&cfg)}
	rep.Setup.Servers, err = env.Versions(ctx)
	if err != nil {
		return nil, err
	}
	rep.Setup.StatsExact = env.StatsFlushable()
	fmt.Fprintf(out, "bench schema %s, redis prefix %s; %d CPUs (load average %s), PostgreSQL %s, Redis %s\n",
		env.Schema, env.Prefix, runtime.NumCPU(), rep.Setup.LoadAverage,
		rep.Setup.Servers["postgres_server_version"], rep.Setup.Servers["redis_redis_version"])

	if len(cfg.Instances) > 0 {
		if err := runInstances(ctx, env, &cfg, rep, out); err != nil {
			return nil, err
		}
		rep.Setup.Finished = time.Now()
		rep.Setup.Interrupted = ctx.Err() != nil
		return rep, nil
	}

	type ladder struct {
		strategy, impl string
		t              target.Target
	}
	var ladders []ladder
	for _, st := range cfg.Strategies {
		for _, impl := range cfg.impls() {
			t, err := target.New(env, st, impl, cfg.Work)
			if err != nil {
				return nil, err
			}
			ladders = append(ladders, ladder{st, impl, t})
		}
	}

	finish := func() (*report.Report, error) {
		rep.Setup.Finished = time.Now()
		rep.Setup.Interrupted = ctx.Err() != nil
		return rep, nil
	}

	stepNo := 0
	if cfg.Warmup > 0 {
		fmt.Fprintf(out, "warming up each target for %v\n", cfg.Warmup)
		for _, l := range ladders {
			stepNo++
			s := load.Step{Rate: cfg.Rates[0], Duration: cfg.Warmup, MaxInFlight: cfg.MaxInFlight, Drain: cfg.Drain}
			if _, err := load.Run(ctx, s, op(l.t, load.Unique(), stepNo)); err != nil {
				return nil, err
			}
			if ctx.Err() != nil {
				return finish()
			}
		}
	}

	fmt.Fprintln(out, report.Header())
	if cfg.NoiseRuns > 1 {
		// The noise: the same step (scenario, rate, target) run
		// NoiseRuns times, targets in alternating order.
		sc, rate := cfg.Scenarios[0], cfg.Rates[0]
		pattern := cfg.pattern(sc, rate)
		for run := range cfg.NoiseRuns {
			for _, i := range alternate(len(ladders), run) {
				l := ladders[i]
				stepNo++
				row, err := step(ctx, env, &cfg, l.t.Table(), op(l.t, pattern, stepNo), sc, pattern, rate)
				if err != nil {
					if ctx.Err() != nil {
						return finish()
					}
					return nil, err
				}
				row.Strategy, row.Impl, row.Run = l.strategy, l.impl, run+1
				rep.Repeats = append(rep.Repeats, row)
				fmt.Fprintln(out, report.Line(row))
				if row.Interrupted {
					return finish()
				}
			}
		}
	}
	for _, sc := range cfg.Scenarios {
		alive := make([]bool, len(ladders))
		for i := range alive {
			alive[i] = true
		}
		for ri, rate := range cfg.Rates {
			if !slices.Contains(alive, true) {
				break
			}
			pattern := cfg.pattern(sc, rate)
			// Alternate the order from one rate to the next, so that a
			// drift (a checkpoint, autovacuum, the previous step's
			// leftovers) does not always fall on the same target.
			for _, i := range alternate(len(ladders), ri) {
				l := ladders[i]
				if !alive[i] {
					continue
				}
				stepNo++
				row, err := step(ctx, env, &cfg, l.t.Table(), op(l.t, pattern, stepNo), sc, pattern, rate)
				if err != nil {
					if ctx.Err() != nil {
						return finish()
					}
					return nil, err
				}
				row.Strategy, row.Impl = l.strategy, l.impl
				rep.Rows = append(rep.Rows, row)
				fmt.Fprintln(out, report.Line(row))
				if row.Interrupted {
					return finish()
				}
				if row.Saturated {
					alive[i] = false
				}
			}
		}
	}
	return finish()
}

// op turns arrivals into requests: scope user-<intent mod 1000>, a key
// unique to the step and intent, and a fingerprint of the key.
func op(t target.Target, p load.Pattern, stepNo int) load.Op {
	prefix := "s" + strconv.Itoa(stepNo) + "-"
	return func(ctx context.Context, i int64) (string, error) {
		a := p.At(i)
		key := prefix + strconv.FormatInt(a.Intent, 36)
		req := idem.Request{
			Scope:       "user-" + strconv.FormatInt(a.Intent%1000, 10),
			Key:         key,
			Fingerprint: sha256.Sum256([]byte(key)),
		}
		return t.Do(ctx, req)
	}
}

// step runs one step of o, whose target writes table, and measures it.
func step(ctx context.Context, env *target.Env, cfg *Config, table string, o load.Op, scenario string, p load.Pattern, rate float64) (report.Row, error) {
	row := report.Row{Scenario: scenario, Pattern: p.String(), DupShare: p.DupShare(), Offered: rate}
	if err := env.Truncate(ctx, table); err != nil {
		return row, err
	}
	before, err := env.Snapshot(ctx, table)
	if err != nil {
		return row, err
	}
	s := load.Step{Rate: rate, Duration: cfg.Step, MaxInFlight: cfg.MaxInFlight, Drain: cfg.Drain}
	res, err := load.Run(ctx, s, o)
	if err != nil {
		return row, err
	}
	sctx := context.WithoutCancel(ctx)
	after, err := env.Snapshot(sctx, table)
	if err != nil {
		return row, err
	}
	d, err := env.Since(sctx, before, after)
	if err != nil {
		return row, err
	}
	row.Achieved = res.Achieved()
	row.P50, row.P90 = res.Latency.Quantile(0.50), res.Latency.Quantile(0.90)
	row.P99, row.P999 = res.Latency.Quantile(0.99), res.Latency.Quantile(0.999)
	row.Max = res.Latency.Max()
	row.SvcP50, row.SvcP99 = res.Service.Quantile(0.50), res.Service.Quantile(0.99)
	row.Requests, row.Errors, row.Dropped = res.Completed, res.Errors, res.Dropped
	row.Executed = res.Outcomes[idem.OutcomeExecuted.String()]
	row.Replayed = res.Outcomes[idem.OutcomeReplayed.String()]
	row.InProgress = res.Outcomes[idem.OutcomeInProgress.String()]
	row.KeyReused = res.Outcomes[idem.OutcomeKeyReused.String()]
	if n := float64(res.Completed); n > 0 {
		row.PGStatements = float64(d.PGStatements) / n
		row.TupleWrites = float64(d.TupleWrites) / n
		row.WALBytes = float64(d.WALBytes) / n
		row.RedisServer = float64(d.RedisServer) / n
		row.RedisClient = float64(d.RedisClient) / n
	}
	row.Interrupted = res.Interrupted
	if err := cfg.Limits.Check(res); err != nil {
		row.Saturated = true
		row.Note = strings.TrimPrefix(err.Error(), load.ErrSaturated.Error()+": ")
	}
	if res.FirstErr != nil {
		note := "first error: " + strings.ReplaceAll(res.FirstErr.Error(), "\n", "; ")
		if row.Note != "" {
			note = row.Note + "; " + note
		}
		row.Note = note
	}
	return row, nil
}

func setup(cfg *Config) report.Setup {
	return report.Setup{
		Command:     cfg.Command,
		Started:     time.Now(),
		GoVersion:   runtime.Version(),
		OS:          runtime.GOOS,
		Arch:        runtime.GOARCH,
		CPUs:        runtime.NumCPU(),
		GOMAXPROCS:  runtime.GOMAXPROCS(0),
		CPUModel:    cpuModel(),
		LoadAverage: loadAverage(),
		Step:        cfg.Step,
		Drain:       cfg.Drain,
		Rates:       cfg.Rates,
		MaxInFlight: cfg.MaxInFlight,
		PoolSize:    cfg.Target.PoolSize,
		Work:        cfg.Work,
		Dup:         cfg.Dup,
		StormK:      cfg.StormK,
		StormWindow: cfg.StormWindow,
		MaxP99:      cfg.Limits.MaxP99,
	}
}

// cpuModel returns the CPU's model name on Linux, "" elsewhere.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for line := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// loadAverage returns the 1, 5 and 15 minute load averages on Linux, "" elsewhere.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
