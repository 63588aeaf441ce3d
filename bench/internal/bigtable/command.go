package bigtable

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/idemguard/idem/bench/internal/cli"
)

const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Command is `go run ./bench bigtable [flags]`: it parses args, runs, writes
// the report and returns the exit status (130 when interrupted).
func Command(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bigtable", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: go run ./bench bigtable [flags]\n\n"+
			"Loads a table of the durable store to each size in turn and measures the claim of a new key,\n"+
			"the replay (Claim and Get of an answered key), Complete and the Sweeper, the sizes on disk and\n"+
			"the HOT share of the answer writes; then mixed load with the sweeper running. Needs disk:\n"+
			"about 650 MB per million rows, plus WAL.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	def := os.Getenv("DATABASE_URL")
	if def == "" {
		def = defaultDatabaseURL
	}
	var (
		dbURL    = fs.String("database-url", def, "PostgreSQL URL (default $DATABASE_URL, else the local default)")
		rowsFlag = fs.String("rows", "1000000", "sizes in live rows, comma-separated, ascending (suffixes k and M accepted: 1M,10M)")
		samples  = fs.Int("samples", 3000, "samples per operation and concurrency")
		concFlag = fs.String("conc", "1,8", "concurrency levels")
		expired  = fs.Float64("expired", 1.0/24, "rows loaded just past the retention, for the sweeper, as a share of the live rows")
		chunk    = fs.Int64("chunk", 100_000, "rows per INSERT of the loader")
		workers  = fs.Int("load-workers", 2, "INSERTs running at once")
		headroom = fs.Duration("headroom", 2*time.Hour, "live rows are spread over the retention less this, so none expires during the run")
		phase    = fs.Duration("phase", 60*time.Second, "length of each mixed phase with the sweeper running, at the largest size (0: none)")
		autovac  = fs.Bool("autovacuum", false, "also run the phase with the server's autovacuum on: ALTER SYSTEM SET autovacuum = on, restored on exit (server-wide!)")
		parts    = fs.Int("partitions", 0, "create the table hash-partitioned on user_id into this many partitions (durable.Config.Partitions; 0: one plain table)")
		outDir   = fs.String("out", "bench-report-bigtable", "report directory (created; report.md and results.csv replaced)")
	)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bigtable: unexpected arguments %q\n", fs.Args())
		return 2
	}
	rows, err := parseCounts(*rowsFlag)
	if err != nil {
		fmt.Fprintf(stderr, "bigtable: -rows: %v\n", err)
		return 2
	}
	var conc []int
	for f := range strings.SplitSeq(*concFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(stderr, "bigtable: -conc: %q is not a positive integer\n", f)
			return 2
		}
		conc = append(conc, n)
	}
	cfg := Config{
		DatabaseURL: *dbURL, Rows: rows, Samples: *samples, Concurrency: conc,
		ExpiredShare: *expired, Chunk: *chunk, LoadWorkers: *workers, Headroom: *headroom,
		Phase: *phase, Autovacuum: *autovac, Partitions: *parts, Command: cli.CommandLine("go run ./bench bigtable", fs), Progress: stdout,
	}
	if *phase == 0 {
		cfg.Phase = -1
	}
	rep, err := Run(ctx, cfg)
	if rep != nil {
		if werr := rep.Write(*outDir); werr != nil {
			fmt.Fprintf(stderr, "bigtable: writing the report: %v\n", werr)
			return 1
		}
		fmt.Fprintf(stdout, "report: %s/%s and %s\n", *outDir, MarkdownFile, CSVFile)
	}
	switch {
	case rep != nil && rep.Interrupted:
		fmt.Fprintf(stderr, "bigtable: interrupted: %v\n", err)
		return 130
	case err != nil:
		fmt.Fprintf(stderr, "bigtable: %v\n", err)
		return 1
	}
	return 0
}

// parseCounts reads "1000000,10M,500k".
func parseCounts(s string) ([]int64, error) {
	var out []int64
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		mult := int64(1)
		switch {
		case strings.HasSuffix(f, "M"):
			mult, f = 1_000_000, strings.TrimSuffix(f, "M")
		case strings.HasSuffix(f, "k"):
			mult, f = 1_000, strings.TrimSuffix(f, "k")
		}
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive count", f)
		}
		out = append(out, n*mult)
	}
	return out, nil
}
