// Package crossover answers the question the hybrid strategy exists for:
// from which share of retries, and at which distance of PostgreSQL, does the
// Redis lease in front of the table pay? `go run ./bench crossover` drives
// both strategies' real Guard in one run, closed loop, for every retry share
// and distance, in interleaved rounds, and reports saturated throughput,
// p99, PostgreSQL statements and CPU per request, the crossover plot and a
// verdict per distance; beside them, in the same rounds, the p50 of first
// executions at 1 caller (new keys only, a handler that takes no time), what
// the lease adds to a request when nothing is saturated.
//
// PostgreSQL's distance is added by a delay proxy in a process of its own
// (package delayproxy): this machine's kernel has no netem. The proxy's CPU
// is measured and reported apart.
package crossover

import (
	"cmp"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/bench/internal/delayproxy"
	"github.com/idemguard/idem/bench/internal/fleet"
	"github.com/idemguard/idem/bench/internal/target"
)

// Config is one sweep.
type Config struct {
	DatabaseURL, RedisAddr string
	// Shares are the retry shares swept, each in [0, 1).
	Shares []float64
	// Distances are the round-trip times added to PostgreSQL's; 0 is the
	// server itself, over loopback, without the proxy.
	Distances []time.Duration
	// Rounds of every share at every distance; the two strategies run
	// back to back in each, in alternating order.
	Rounds int
	// Run is how long each strategy runs per share and round.
	Run time.Duration
	// Callers is the closed loop's concurrency: enough to saturate. Each
	// round also runs each strategy with 1 caller on new keys, with a
	// handler that takes no time, for Run.
	Callers int
	// Recent is how many of the latest intents a retry picks from.
	Recent int
	// Settle is how many requests of its share a cell sends before it is
	// measured (see cli.SettleFlag).
	Settle                  int
	PoolSize, RedisPoolSize int
	Work                    time.Duration // the handler's latency
	// Binary is the executable run as the delay proxy (the bench's own).
	Binary   string
	Progress io.Writer
}

// Cell is one strategy's run at one share, distance and round.
type Cell struct {
	Distance    time.Duration // added round-trip time (0: loopback)
	MeasuredRTT time.Duration // median SELECT 1 round trip through the pool
	Share       float64
	Strategy    string
	Round       int
	// Lone marks a run of 1 caller on new keys only (Share 0) and a handler
	// that takes no time: its P50 is the guard's own latency for a first
	// execution when nothing else runs. Otherwise the run has
	// Config.Callers callers and the handler takes Config.Work.
	Lone bool

	Requests, Errors int64
	Elapsed          time.Duration
	P50, P99         time.Duration
	Outcomes         map[string]int64
	PGStatements     int64
	RedisCommands    int64
	PGCPU, ProxyCPU  float64 // CPU seconds during the run
	// GuardCPU is the bench process's (the guard and the load driver),
	// RedisCPU the Redis server's, in CPU seconds during the run.
	GuardCPU, RedisCPU float64
	MachineCores       float64 // machine-wide busy cores during the run
	FirstErr           string
}

// Throughput is requests answered without error per second.
func (c Cell) Throughput() float64 {
	if c.Elapsed <= 0 {
		return 0
	}
	return float64(c.Requests-c.Errors) / c.Elapsed.Seconds()
}

func (c Cell) per(v float64) float64 {
	if c.Requests == 0 {
		return 0
	}
	return v / float64(c.Requests)
}

// StatementsPerRequest is PostgreSQL statements per request (client side).
func (c Cell) StatementsPerRequest() float64 { return c.per(float64(c.PGStatements)) }

// PGMicrosPerRequest is PostgreSQL's CPU per request in µs (its backends
// for the bench and its background processes).
func (c Cell) PGMicrosPerRequest() float64 { return c.per(1e6 * c.PGCPU) }

// GuardMicrosPerRequest is the bench process's CPU per request in µs: the
// guard, its clients and the load driver.
func (c Cell) GuardMicrosPerRequest() float64 { return c.per(1e6 * c.GuardCPU) }

// RedisMicrosPerRequest is the Redis server's CPU per request in µs.
func (c Cell) RedisMicrosPerRequest() float64 { return c.per(1e6 * c.RedisCPU) }

// ProxyMicrosPerRequest is the delay proxy's CPU per request in µs.
func (c Cell) ProxyMicrosPerRequest() float64 { return c.per(1e6 * c.ProxyCPU) }

// Result is a whole sweep.
type Result struct {
	Config      Config
	Cells       []Cell
	Started     time.Time
	Finished    time.Time
	Interrupted bool
	Versions    map[string]string
}

// Run sweeps every distance, share and strategy. It returns what ran when
// ctx ends (Interrupted set).
func Run(ctx context.Context, cfg Config) (*Result, error) {
	res := &Result{Config: cfg, Started: time.Now()}
	defer func() { res.Finished = time.Now() }()
	var seq atomic.Int64 // keys are unique over the whole run
	for _, d := range cfg.Distances {
		if err := runDistance(ctx, cfg, d, &seq, res); err != nil {
			if ctx.Err() != nil {
				res.Interrupted = true
				return res, nil
			}
			return res, err
		}
	}
	return res, nil
}

func runDistance(ctx context.Context, cfg Config, d time.Duration, seq *atomic.Int64, res *Result) error {
	dbURL := cfg.DatabaseURL
	var proxy *delayproxy.Process
	if d > 0 {
		var err error
		if proxy, dbURL, err = delayproxy.Between(ctx, cfg.Binary, cfg.DatabaseURL, d); err != nil {
			return err
		}
		defer proxy.Close()
	}
	env, err := target.Open(ctx, target.Config{
		DatabaseURL: dbURL, RedisAddr: cfg.RedisAddr, PoolSize: cfg.PoolSize, RedisPoolSize: cfg.RedisPoolSize,
	})
	if err != nil {
		return err
	}
	defer env.Close(context.WithoutCancel(ctx))
	if res.Versions == nil {
		if res.Versions, err = env.Versions(ctx); err != nil {
			return err
		}
	}
	rtt, err := measureRTT(ctx, env)
	if err != nil {
		return err
	}
	meter := fleet.NewMeter(cfg.RedisAddr, env.Pool, env.Schema)
	defer meter.Close()
	targets, lone := map[string]*target.Guard{}, map[string]*target.Guard{}
	for _, s := range []string{target.Table, target.Hybrid} {
		if targets[s], err = target.NewGuardTarget(env, s, cfg.Work); err != nil {
			return err
		}
		if lone[s], err = target.NewGuardTarget(env, s, 0); err != nil { // the guard's own latency
			return err
		}
		// Dial the pools, load the scripts.
		if _, err := cell(ctx, cfg, env, meter, proxy, targets[s], 0.5, cfg.Callers, cfg.Run/4, seq); err != nil {
			return err
		}
	}
	fmt.Fprintf(cfg.Progress, "distance +%v: SELECT 1 round trip %v (median of 200)\n", d, rtt.Round(time.Microsecond))
	fmt.Fprintf(cfg.Progress, "%-9s %5s %5s %-7s %8s %9s %9s %7s %8s %8s %8s %8s %6s %6s\n",
		"distance", "round", "retry", "strategy", "req/s", "p50", "p99", "pg st/r", "pg µs/r", "app µs/r", "rds µs/r", "px µs/r", "cores", "err")
	for round := range cfg.Rounds {
		// Cells of (share, callers): the 1-caller first executions, then
		// the saturated shares; every other round in reverse. Which
		// strategy goes first alternates from round to round for each
		// cell, and from cell to cell within a round.
		type run struct {
			share   float64
			callers int
			lone    bool
			index   int // in the first round's order
		}
		runs := []run{{0, 1, true, 0}}
		for i, s := range cfg.Shares {
			runs = append(runs, run{s, cfg.Callers, false, i + 1})
		}
		if round%2 == 1 {
			slices.Reverse(runs)
		}
		for _, r := range runs {
			order := []string{target.Table, target.Hybrid}
			if (round+r.index)%2 == 1 {
				order = []string{target.Hybrid, target.Table}
			}
			for _, s := range order {
				t := targets[s]
				if r.lone {
					t = lone[s]
				}
				c, err := cell(ctx, cfg, env, meter, proxy, t, r.share, r.callers, cfg.Run, seq)
				if err != nil {
					return err
				}
				c.Distance, c.MeasuredRTT, c.Share, c.Strategy, c.Round, c.Lone = d, rtt, r.share, s, round+1, r.lone
				res.Cells = append(res.Cells, c)
				retry := fmt.Sprintf("%4.0f%%", 100*r.share)
				if r.lone {
					retry = "1 cl" // one caller, new keys
				}
				fmt.Fprintf(cfg.Progress, "%-9s %5d %5s %-7s %8.0f %9v %9v %7.2f %8.0f %8.0f %8.0f %8.0f %6.2f %6d\n",
					"+"+d.String(), c.Round, retry, s, c.Throughput(), c.P50.Round(10*time.Microsecond), c.P99.Round(10*time.Microsecond),
					c.StatementsPerRequest(), c.PGMicrosPerRequest(), c.GuardMicrosPerRequest(), c.RedisMicrosPerRequest(),
					c.ProxyMicrosPerRequest(), c.MachineCores, c.Errors)
			}
		}
	}
	return nil
}

// measureRTT is the median of 200 SELECT 1 through the env's pool.
func measureRTT(ctx context.Context, env *target.Env) (time.Duration, error) {
	var ds []time.Duration
	for range 200 {
		t := time.Now()
		if _, err := env.Pool.Exec(ctx, "SELECT 1"); err != nil {
			return 0, err
		}
		ds = append(ds, time.Since(t))
	}
	slices.Sort(ds)
	return ds[len(ds)/2], nil
}

// cell runs t closed loop for cfg.Settle requests, then measures it for
// d: each of callers callers sends, with probability share, a retry of one
// of the cfg.Recent latest intents (same key, same fingerprint), and
// otherwise a new intent.
func cell(ctx context.Context, cfg Config, env *target.Env, meter *fleet.Meter, proxy *delayproxy.Process,
	t *target.Guard, share float64, callers int, d time.Duration, seq *atomic.Int64) (Cell, error) {
	var c Cell
	if err := env.Reset(ctx, target.GuardTable); err != nil {
		return c, err
	}
	recent := make([]int64, max(cfg.Recent, 1))
	var (
		recentMu sync.Mutex
		recentN  int
	)
	var (
		requests, errs atomic.Int64
		outMu          sync.Mutex
		firstErr       error
		latencies      []time.Duration
		outcomes       = map[string]int64{}
	)
	// drive runs the callers closed loop until stop says so, counting into
	// the variables above; each caller keeps its own outcomes and latencies
	// until the end.
	drive := func(stop func() bool) {
		var wg sync.WaitGroup
		seed := uint64(time.Now().UnixNano())
		for w := range callers {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), seed))
				local := map[string]int64{}
				var lat []time.Duration
				for ctx.Err() == nil && !stop() {
					var k int64
					recentMu.Lock()
					if recentN > 0 && rng.Float64() < share {
						k = recent[rng.IntN(min(recentN, len(recent)))]
						recentMu.Unlock()
					} else {
						recentMu.Unlock()
						k = seq.Add(1)
						recentMu.Lock()
						recent[recentN%len(recent)] = k
						recentN++
						recentMu.Unlock()
					}
					key := "x" + strconv.FormatInt(k, 36)
					req := idem.Request{Scope: "user-" + strconv.FormatInt(k%1000, 10), Key: key,
						Fingerprint: sha256.Sum256([]byte(key))}
					t0 := time.Now()
					out, err := t.Do(ctx, req)
					lat = append(lat, time.Since(t0))
					requests.Add(1)
					if err != nil {
						errs.Add(1)
						outMu.Lock()
						firstErr = cmp.Or(firstErr, err)
						outMu.Unlock()
						continue
					}
					local[out]++
				}
				outMu.Lock()
				for k, v := range local {
					outcomes[k] += v
				}
				latencies = append(latencies, lat...)
				outMu.Unlock()
			})
		}
		wg.Wait()
	}
	drive(func() bool { return requests.Load() >= int64(cfg.Settle) })
	// The settling requests' errors count (an error is an error of the
	// run); nothing else of theirs does.
	settleErrs := errs.Load()
	requests.Store(0)
	errs.Store(0)
	latencies = latencies[:0]
	clear(outcomes)
	stmt0, cmd0 := env.PGStatements.Count(), env.RedisCmds.Count()
	proxy0 := proxyCPU(proxy)
	cpu0 := meter.Read(ctx, nil)
	start := time.Now()
	deadline := start.Add(d)
	drive(func() bool { return time.Now().After(deadline) })
	errs.Add(settleErrs)
	c.Elapsed = time.Since(start)
	cpu1 := meter.Read(ctx, nil)
	u := fleet.Between(cpu0, cpu1)
	secs := cpu1At(cpu0, cpu1, c.Elapsed)
	c.PGCPU = u.Postgres * secs
	c.GuardCPU, c.RedisCPU = u.Driver*secs, u.Redis*secs
	c.MachineCores = u.Machine
	c.ProxyCPU = proxyCPU(proxy) - proxy0
	c.Requests, c.Errors = requests.Load(), errs.Load()
	slices.Sort(latencies)
	c.P50, c.P99 = quantile(latencies, 0.5), quantile(latencies, 0.99)
	c.Outcomes = outcomes
	c.PGStatements = env.PGStatements.Count() - stmt0
	c.RedisCommands = env.RedisCmds.Count() - cmd0
	if firstErr != nil {
		c.FirstErr = firstErr.Error()
	}
	return c, ctx.Err()
}

// cpu1At is the time between the two CPU readings, which Usage's cores are
// per: the run's elapsed time plus the readings' own.
func cpu1At(before, after fleet.Reading, elapsed time.Duration) float64 {
	if s := after.At().Sub(before.At()).Seconds(); s > 0 {
		return s
	}
	return elapsed.Seconds()
}

func proxyCPU(p *delayproxy.Process) float64 {
	if p == nil {
		return 0
	}
	s, _ := fleet.ProcessCPU(p.PID())
	return s
}
