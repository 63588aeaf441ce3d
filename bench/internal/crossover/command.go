package crossover

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/idemguard/idem/bench/internal/cli"
)

// Command is `go run ./bench crossover [flags]`: it parses args, runs the
// sweep, prints the summary, writes the report and returns the exit status
// (130 when interrupted).
func Command(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("crossover", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: go run ./bench crossover [flags]\n\n"+
			"Sweeps the retry share and PostgreSQL's distance for both strategies of the guard, closed loop,\n"+
			"in interleaved rounds, and reports from which share of retries the Redis lease pays, and what it adds to\n"+
			"a first execution's p50 at 1 caller.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	dbURL, redisAddr := cli.ServerFlags(fs)
	settle := cli.SettleFlag(fs)
	var (
		shares    = fs.String("shares", "0,0.01,0.05,0.2,0.5,0.8,0.95", "retry shares, comma-separated, each in [0, 1)")
		distances = fs.String("distances", "0,500us,2ms", "round-trip times added to PostgreSQL's (0: loopback, no proxy)")
		rounds    = fs.Int("rounds", 3, "rounds of every share and distance")
		runFor    = fs.Duration("run", 3*time.Second, "how long each strategy runs per share, distance and round")
		callers   = fs.Int("callers", 128, "closed-loop callers")
		recent    = fs.Int("recent", 128, "a retry repeats one of this many latest intents")
		poolSize  = fs.Int("pool-size", 16, "pgx pool size (MaxConns)")
		redisPool = fs.Int("redis-pool-size", 0, "go-redis pool size (0: go-redis' default)")
		work      = fs.Duration("work", 5*time.Millisecond, "simulated handler latency")
		outDir    = fs.String("out", "bench-report-crossover", "report directory (created; its files replaced)")
	)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "crossover: unexpected arguments %q\n", fs.Args())
		return 2
	}
	cfg := Config{DatabaseURL: *dbURL, RedisAddr: *redisAddr, Rounds: *rounds, Run: *runFor, Callers: *callers,
		Recent: *recent, Settle: *settle, PoolSize: *poolSize, RedisPoolSize: *redisPool, Work: *work, Progress: stdout}
	for _, s := range cli.Split(*shares) {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v < 0 || v >= 1 {
			fmt.Fprintf(stderr, "crossover: -shares: %q is not in [0, 1)\n", s)
			return 2
		}
		cfg.Shares = append(cfg.Shares, v)
	}
	for _, s := range cli.Split(*distances) {
		if s == "0" {
			cfg.Distances = append(cfg.Distances, 0)
			continue
		}
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			fmt.Fprintf(stderr, "crossover: -distances: %q is not a duration\n", s)
			return 2
		}
		cfg.Distances = append(cfg.Distances, d)
	}
	if len(cfg.Shares) == 0 || len(cfg.Distances) == 0 || cfg.Rounds < 1 || cfg.Run <= 0 || cfg.Callers < 1 || cfg.Settle < 0 {
		fmt.Fprintln(stderr, "crossover: need shares, distances, -rounds >= 1, a positive -run and -callers, -settle >= 0")
		return 2
	}
	var err error
	if cfg.Binary, err = os.Executable(); err != nil {
		fmt.Fprintf(stderr, "crossover: %v\n", err)
		return 1
	}
	res, err := Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "crossover: %v\n", err)
		return 1
	}
	res.Summary(stdout)
	if err := res.Write(*outDir, cli.CommandLine("go run ./bench crossover", fs)); err != nil {
		fmt.Fprintf(stderr, "crossover: writing the report: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "\nreport: %s/%s (also %s, %s)\n", *outDir, MarkdownFile, CSVFile, PNGFile)
	if res.Interrupted {
		return 130
	}
	return 0
}
