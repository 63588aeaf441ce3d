package plan

import (
	"context"
	"fmt"
	"io"

	"github.com/idemguard/idem/bench/internal/fleet"
	"github.com/idemguard/idem/bench/internal/load"
	"github.com/idemguard/idem/bench/internal/report"
	"github.com/idemguard/idem/bench/internal/target"
)

// poolPerInstance divides the pgx pool among n workers, at least one
// connection each, so that the fleet holds about as many connections as
// the single in-process guard.
func poolPerInstance(pool, n int) int { return max(1, pool/n) }

// runInstances runs the many-instance ladders: for each strategy and
// instance count, it starts that many worker processes, warms them up, runs
// every scenario's ladder through them until it saturates, and stops them.
func runInstances(ctx context.Context, env *target.Env, cfg *Config, rep *report.Report, out io.Writer) error {
	meter := fleet.NewMeter(cfg.Target.RedisAddr, env.Pool, env.Schema)
	defer meter.Close()
	stepNo := 0
	for _, st := range cfg.Strategies {
		for _, n := range cfg.Instances {
			if ctx.Err() != nil {
				return nil
			}
			pool := poolPerInstance(cfg.Target.PoolSize, n)
			redisPool := 0
			if cfg.Target.RedisPoolSize > 0 {
				redisPool = max(1, cfg.Target.RedisPoolSize/n)
			}
			f, err := fleet.Start(ctx, fleet.Config{
				DatabaseURL:   cfg.Target.DatabaseURL,
				RedisAddr:     cfg.Target.RedisAddr,
				Schema:        env.Schema,
				Prefix:        env.Prefix,
				Strategy:      st,
				PoolSize:      pool,
				RedisPoolSize: redisPool,
				Work:          cfg.Work,
				MaxInFlight:   cfg.MaxInFlight,
			}, n)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			fmt.Fprintf(out, "%s: %d instances (pids %v), pgx pool %d each\n", st, n, f.PIDs(), pool)
			err = runFleet(ctx, env, cfg, meter, f, st, pool, &stepNo, rep, out)
			if cerr := f.Close(); err == nil && cerr != nil && ctx.Err() == nil {
				err = cerr
			}
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
		}
	}
	return nil
}

// runFleet runs every scenario's ladder through the running fleet f.
func runFleet(ctx context.Context, env *target.Env, cfg *Config, meter *fleet.Meter, f *fleet.Fleet, strategy string, pool int, stepNo *int, rep *report.Report, out io.Writer) error {
	if cfg.Warmup > 0 {
		*stepNo++
		s := load.Step{Rate: cfg.Rates[0], Duration: cfg.Warmup, MaxInFlight: cfg.MaxInFlight, Drain: cfg.Drain}
		if _, err := load.Run(ctx, s, f.Op(load.Unique(), *stepNo)); err != nil {
			return err
		}
	}
	fmt.Fprintln(out, report.InstanceHeader())
	for _, sc := range cfg.Scenarios {
		for _, rate := range cfg.Rates {
			if ctx.Err() != nil {
				return nil
			}
			*stepNo++
			p := cfg.pattern(sc, rate)
			// What the workers counted so far (the warm-up, an earlier
			// step's stragglers) is not this step's.
			if _, err := f.Collect(ctx); err != nil {
				return err
			}
			before := meter.Read(ctx, f)
			row, err := step(ctx, env, cfg, target.GuardTable, f.Op(p, *stepNo), sc, p, rate)
			after := meter.Read(context.WithoutCancel(ctx), f)
			if err != nil {
				return err
			}
			stats, err := f.Collect(context.WithoutCancel(ctx))
			if err != nil {
				return err
			}
			ir := instanceRow(row, strategy, pool, p, stats)
			ir.CPU = report.CPU(fleet.Between(before, after))
			rep.Instances = append(rep.Instances, ir)
			fmt.Fprintln(out, report.InstanceLine(ir))
			if row.Interrupted || row.Saturated {
				break
			}
		}
	}
	return nil
}

// instanceRow completes a step's row with what the workers counted: the
// statements and commands they sent, the requests each answered, and the
// handler's executions against the step's intents.
func instanceRow(row report.Row, strategy string, pool int, p load.Pattern, stats []fleet.Stats) report.InstanceRow {
	row.Strategy, row.Impl = strategy, target.Guard
	ir := report.InstanceRow{Row: row, Instances: len(stats), PoolPerInstance: pool}
	executed := map[string]int{}
	var stmts, cmds int64
	for _, s := range stats {
		ir.PerInstance = append(ir.PerInstance, s.Requests)
		stmts += s.PGStatements
		cmds += s.RedisCommands
		for k, v := range s.Executed {
			executed[k] += v
		}
	}
	for _, v := range executed {
		ir.Executions += int64(v)
		if v > 1 {
			ir.Doubles++
		}
	}
	// Every arrival issued completed (Run waits for them), so the first
	// Requests arrivals are the ones sent.
	intents := map[int64]bool{}
	for i := range row.Requests {
		intents[p.At(i).Intent] = true
	}
	ir.Intents = int64(len(intents))
	if n := float64(row.Requests); n > 0 {
		ir.PGStatements = float64(stmts) / n
		ir.RedisClient = float64(cmds) / n
	}
	return ir
}
