package report

import (
	"encoding/csv"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Files written by Write, in its directory.
const (
	MarkdownFile   = "report.md"
	CSVFile        = "results.csv"
	P99Plot        = "p99.png"
	ThroughputPlot = "throughput.png"
)

// Write creates dir if needed and writes report.md, results.csv, p99.png and
// throughput.png into it.
func Write(dir string, r *Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	write := func(name string, fn func(io.Writer) error) error {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		if err := fn(f); err != nil {
			f.Close()
			return fmt.Errorf("%s: %w", name, err)
		}
		return f.Close()
	}
	if err := write(CSVFile, r.WriteCSV); err != nil {
		return err
	}
	if err := write(MarkdownFile, r.WriteMarkdown); err != nil {
		return err
	}
	if err := r.PlotP99(filepath.Join(dir, P99Plot)); err != nil {
		return fmt.Errorf("%s: %w", P99Plot, err)
	}
	if err := r.PlotThroughput(filepath.Join(dir, ThroughputPlot)); err != nil {
		return fmt.Errorf("%s: %w", ThroughputPlot, err)
	}
	return nil
}

var csvHeader = []string{
	"scenario", "pattern", "dup_share", "strategy", "impl", "offered_rps", "achieved_rps",
	"p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms", "service_p50_ms", "service_p99_ms",
	"requests", "errors", "dropped", "executed", "replayed", "in_progress", "key_reused",
	"pg_statements_per_req", "pg_tuple_writes_per_req", "wal_bytes_per_req",
	"redis_server_cmds_per_req", "redis_client_cmds_per_req", "saturated", "interrupted", "note",
}

func msf(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 3, 64)
}

func f(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }

// WriteCSV writes one line per row, durations in milliseconds.
func (r *Report) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(csvHeader); err != nil {
		return err
	}
	for _, row := range r.Rows {
		rec := []string{
			row.Scenario, row.Pattern, f(row.DupShare, 3), row.Strategy, row.Impl,
			f(row.Offered, 1), f(row.Achieved, 1),
			msf(row.P50), msf(row.P90), msf(row.P99), msf(row.P999), msf(row.Max), msf(row.SvcP50), msf(row.SvcP99),
			strconv.FormatInt(row.Requests, 10), strconv.FormatInt(row.Errors, 10), strconv.FormatInt(row.Dropped, 10),
			strconv.FormatInt(row.Executed, 10), strconv.FormatInt(row.Replayed, 10),
			strconv.FormatInt(row.InProgress, 10), strconv.FormatInt(row.KeyReused, 10),
			f(row.PGStatements, 3), f(row.TupleWrites, 3), f(row.WALBytes, 0),
			f(row.RedisServer, 3), f(row.RedisClient, 3),
			strconv.FormatBool(row.Saturated), strconv.FormatBool(row.Interrupted), row.Note,
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// WriteMarkdown writes the human report: setup, the planner's answer, the
// guard's overhead, a table per scenario and the plots.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	s := r.Setup
	b.WriteString("# idem capacity report\n\n")
	if s.Interrupted {
		b.WriteString("**Interrupted**: this report covers only the steps that ran before Ctrl-C.\n\n")
	}
	b.WriteString("## Setup\n\n")
	fmt.Fprintf(&b, "- Command: `%s`\n", s.Command)
	fmt.Fprintf(&b, "- Run: %s, %s\n", s.Started.UTC().Format(time.RFC3339), s.Finished.Sub(s.Started).Round(time.Second))
	fmt.Fprintf(&b, "- Machine: %d CPUs (GOMAXPROCS %d)%s, %s/%s, %s; the servers and the bench share it\n",
		s.CPUs, s.GOMAXPROCS, cpuModel(s.CPUModel), s.OS, s.Arch, s.GoVersion)
	if s.LoadAverage != "" {
		fmt.Fprintf(&b, "- Load average when the run started: %s\n", s.LoadAverage)
	}
	for _, k := range slices.Sorted(maps.Keys(s.Servers)) {
		fmt.Fprintf(&b, "- %s: %s\n", k, s.Servers[k])
	}
	fmt.Fprintf(&b, "- Load: open loop, steps of %v (drain up to %v), offered rates %s req/s, at most %d requests in flight\n",
		s.Step, s.Drain, rates(s.Rates), s.MaxInFlight)
	fmt.Fprintf(&b, "- pgx pool: %d connections; simulated handler latency: %v\n", s.PoolSize, s.Work)
	fmt.Fprintf(&b, "- Scenarios: retry storms of K=%d copies within %v; mix with %.0f%% retries\n", s.StormK, s.StormWindow, 100*s.Dup)
	limit := "none"
	if s.MaxP99 > 0 {
		limit = s.MaxP99.String()
	}
	fmt.Fprintf(&b, "- Saturation: achieved < 90%% of offered, > 1%% errors or drops, or p99 above %s; a ladder stops at its first saturated step\n", limit)
	if !s.StatsExact {
		b.WriteString("- PostgreSQL < 15: table statistics could not be flushed on demand; tuple writes per request may lag\n")
	}

	b.WriteString("\n## The answer: when does the hybrid beat the table?\n\n")
	verdicts := r.Answer()
	if len(verdicts) == 0 {
		b.WriteString("Not measured: this run did not drive both strategies' guards in any scenario.\n")
	}
	for _, v := range verdicts {
		fmt.Fprintf(&b, "- %s\n", v.Text())
	}

	b.WriteString("\n## Guard overhead against its ceiling\n\n")
	b.WriteString("The ceiling issues the same SQL statements and Redis commands directly through pgx and go-redis, without the guard.\n\n")
	b.WriteString("| scenario | strategy | guard peak req/s | ceiling peak req/s | throughput ratio | at req/s | guard p99 | ceiling p99 | p99 ratio |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, o := range r.Overheads() {
		at, gp, cp, pr := "-", "-", "-", "-"
		if o.At > 0 {
			at, gp, cp, pr = rate(o.At), ms(o.GuardP99), ms(o.CeilingP99), fmt.Sprintf("%.2f", o.P99Ratio)
		}
		fmt.Fprintf(&b, "| %s | %s | %s%s | %s%s | %.2f | %s | %s | %s | %s |\n",
			o.Scenario, o.Strategy, rate(o.GuardPeak), satMark(o.GuardSaturated), rate(o.CeilingPeak), satMark(o.CeilingSaturated),
			o.ThroughputRatio, at, gp, cp, pr)
	}
	b.WriteString("\nA peak marked * is a saturated ladder's best achieved rate (its capacity on this setup); an unmarked peak only shows that the ladder kept up with every offered rate, and its ratio says nothing about capacity. The p99s are those of the highest offered rate at which neither ladder was saturated.\n")

	for _, sc := range r.Scenarios() {
		var pattern string
		for _, row := range r.Rows {
			if row.Scenario == sc {
				pattern = row.Pattern
				break
			}
		}
		fmt.Fprintf(&b, "\n## Scenario %s: %s\n\n", sc, pattern)
		b.WriteString("| strategy | impl | offered | achieved | p50 | p90 | p99 | p99.9 | err% | pg stmts/req | tuple writes/req | WAL B/req | redis cmds/req (server) | (client) | executed / replayed / 409 / 422 | status |\n")
		b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
		for _, st := range []string{"table", "hybrid"} {
			for _, impl := range []string{"guard", "ceiling"} {
				for _, row := range r.Series(sc, st, impl) {
					status := "ok"
					if row.Saturated {
						status = "saturated: " + row.Note
					}
					fmt.Fprintf(&b, "| %s | %s | %.0f | %.0f | %s | %s | %s | %s | %.2f | %.2f | %.2f | %.0f | %.2f | %.2f | %d / %d / %d / %d | %s |\n",
						row.Strategy, row.Impl, row.Offered, row.Achieved, ms(row.P50), ms(row.P90), ms(row.P99), ms(row.P999),
						100*row.ErrorRate(), row.PGStatements, row.TupleWrites, row.WALBytes, row.RedisServer, row.RedisClient,
						row.Executed, row.Replayed, row.InProgress, row.KeyReused, status)
				}
			}
		}
	}

	b.WriteString("\n## Plots\n\n")
	fmt.Fprintf(&b, "![p99 latency against offered load](%s)\n\n![achieved against offered throughput](%s)\n", P99Plot, ThroughputPlot)

	b.WriteString(`
## Reading the figures

- **offered**: requests per second scheduled at fixed intended times (open loop: a slow response does not delay the next request).
- **achieved**: requests completed without error per second, from the first intended start to the last completion.
- **p50 ... p99.9**: latency of guard.Do (simulated handler latency included) from each request's intended start, so queueing behind a saturated system counts (no coordinated omission). HdrHistogram, 3 significant digits.
- **err%**: failed requests plus requests never issued before the drain ran out, over all scheduled. A 409 (in progress) or 422 (key reused) is an answer, not an error.
- **pg stmts/req**: SQL statements sent per request, counted on the client; each is one round trip.
- **tuple writes/req**: n_tup_ins + n_tup_upd + n_tup_del of the target's own table in pg_stat_user_tables, per request.
- **WAL B/req**: WAL bytes generated per request, server-wide (other databases' activity would show here). It also counts what tuple counts miss, such as the row lock an INSERT ... ON CONFLICT DO UPDATE ... WHERE takes on a conflicting row.
- **redis cmds/req (server)**: INFO commandstats calls per request, server-wide; commands run inside a Lua script count too (an EVALSHA of the release script counts as EVALSHA + GET + DEL). **(client)**: commands the client sent.
- **executed / replayed / 409 / 422**: what the guard decided.
`)
	_, err := io.WriteString(w, b.String())
	return err
}

func satMark(sat bool) string {
	if sat {
		return "*"
	}
	return ""
}

func cpuModel(m string) string {
	if m == "" {
		return ""
	}
	return " " + m
}

func rates(rs []float64) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = rate(r)
	}
	return strings.Join(parts, ", ")
}
