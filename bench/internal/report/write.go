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

// Write creates dir if needed and writes report.md and the files of
// [Report.Files] into it.
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
	if r.manyInstances() {
		if err := write(InstancesCSV, r.WriteInstancesCSV); err != nil {
			return err
		}
		if err := write(MarkdownFile, r.WriteMarkdown); err != nil {
			return err
		}
		if err := r.PlotInstances(filepath.Join(dir, InstancesPlot)); err != nil {
			return fmt.Errorf("%s: %w", InstancesPlot, err)
		}
		return nil
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

// Files returns the files Write writes besides report.md: results.csv,
// p99.png and throughput.png, or for a many-instance run instances.csv and
// instances.png.
func (r *Report) Files() []string {
	if r.manyInstances() {
		return []string{InstancesCSV, InstancesPlot}
	}
	return []string{CSVFile, P99Plot, ThroughputPlot}
}

// manyInstances reports whether r is a many-instance run: the guard in
// worker processes, and no in-process ladder.
func (r *Report) manyInstances() bool { return len(r.Instances) > 0 && len(r.Rows) == 0 }

var csvHeader = []string{
	"scenario", "pattern", "dup_share", "strategy", "impl", "offered_rps", "achieved_rps",
	"p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms", "service_p50_ms", "service_p99_ms",
	"requests", "errors", "dropped", "executed", "replayed", "in_progress", "key_reused",
	"pg_statements_per_req", "pg_tuple_writes_per_req", "wal_bytes_per_req",
	"redis_server_cmds_per_req", "redis_client_cmds_per_req", "saturated", "interrupted", "repeat", "note",
}

func msf(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 3, 64)
}

func f(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }

// WriteCSV writes one line per row, the ladders' steps then the noise
// phase's repeats (numbered in the repeat column, empty for a ladder's step),
// durations in milliseconds.
func (r *Report) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(csvHeader); err != nil {
		return err
	}
	for _, row := range slices.Concat(r.Rows, r.Repeats) {
		repeat := ""
		if row.Run > 0 {
			repeat = strconv.Itoa(row.Run)
		}
		rec := []string{
			row.Scenario, row.Pattern, f(row.DupShare, 3), row.Strategy, row.Impl,
			f(row.Offered, 1), f(row.Achieved, 1),
			msf(row.P50), msf(row.P90), msf(row.P99), msf(row.P999), msf(row.Max), msf(row.SvcP50), msf(row.SvcP99),
			strconv.FormatInt(row.Requests, 10), strconv.FormatInt(row.Errors, 10), strconv.FormatInt(row.Dropped, 10),
			strconv.FormatInt(row.Executed, 10), strconv.FormatInt(row.Replayed, 10),
			strconv.FormatInt(row.InProgress, 10), strconv.FormatInt(row.KeyReused, 10),
			f(row.PGStatements, 3), f(row.TupleWrites, 3), f(row.WALBytes, 0),
			f(row.RedisServer, 3), f(row.RedisClient, 3),
			strconv.FormatBool(row.Saturated), strconv.FormatBool(row.Interrupted), repeat, row.Note,
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// WriteMarkdown writes the human report: setup, the planner's answer, the
// overhead ratios, the noise, a table per scenario and the plots.
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

	noise := r.Noise()
	if len(r.Repeats) > 0 {
		runs := 0
		for _, row := range r.Repeats {
			runs = max(runs, row.Run)
		}
		fmt.Fprintf(&b, "- Noise: each target run %d times at %s req/s of %s before the ladders (see \"Noise\")\n",
			runs, rate(noise.Offered), noise.Scenario)
	}

	if r.manyInstances() {
		r.writeInstancesMarkdown(&b)
		_, err := io.WriteString(w, b.String())
		return err
	}

	b.WriteString("\n## The answer: when does the hybrid beat the table?\n\n")
	verdicts := r.Answer()
	if len(verdicts) == 0 {
		b.WriteString("Not measured: this run did not drive both strategies' guards in any scenario.\n")
	}
	for _, v := range verdicts {
		fmt.Fprintf(&b, "- %s\n", v.Text())
	}

	b.WriteString("\n## Overhead: guard ÷ ceiling and ceiling ÷ minimal\n\n")
	b.WriteString("Three implementations of each strategy run the same load. The **ceiling** issues the guard's own SQL statements and Redis commands directly through pgx and go-redis, " +
		"so **guard ÷ ceiling** is the guard's Go overhead. The **minimal** target does the same job with the least SQL on the least schema " +
		"(`INSERT ... ON CONFLICT DO NOTHING`, then a `SELECT` by key when it inserted nothing; an owner-checked `UPDATE` of the answer; " +
		"a table with its primary key and one index on created_at, no CHECKs, no expiry takeover), " +
		"so **ceiling ÷ minimal** is what the store's SQL and schema cost against the bare job.\n\n")
	b.WriteString("Targets: both throughput ratios ≥ 0.9 at 8 and 32 closed-loop callers, the medians of `BenchmarkThroughput`'s ABBA rounds " +
		"(bench/README.md). In this open-loop run the comparable figure is the ratio of two saturated peaks (both marked *): " +
		"an unmarked peak only shows that a ladder kept up with every offered rate, and its ratio says nothing about capacity.\n\n")
	b.WriteString("| scenario | strategy | guard peak req/s | ceiling peak req/s | minimal peak req/s | guard ÷ ceiling | ceiling ÷ minimal | at req/s | guard p99 | ceiling p99 | minimal p99 | p99 guard ÷ ceiling | p99 ceiling ÷ minimal |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, o := range r.Overheads() {
		at, gp, cp, mp, pr, mpr := "-", "-", "-", "-", "-", "-"
		if o.At > 0 {
			at, gp, cp, pr = rate(o.At), ms(o.GuardP99), ms(o.CeilingP99), p99Ratio(o.P99Ratio, noise.Threshold)
			if o.MinimalP99 > 0 {
				mp, mpr = ms(o.MinimalP99), p99Ratio(o.MinimalP99Ratio, noise.Threshold)
			}
		}
		minPeak, minRatio := "-", "-"
		if o.MinimalPeak > 0 {
			minPeak = rate(o.MinimalPeak) + satMark(o.MinimalSaturated)
			minRatio = peakRatio(o.MinimalRatio, o.CeilingSaturated && o.MinimalSaturated)
		}
		fmt.Fprintf(&b, "| %s | %s | %s%s | %s%s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			o.Scenario, o.Strategy, rate(o.GuardPeak), satMark(o.GuardSaturated), rate(o.CeilingPeak), satMark(o.CeilingSaturated),
			minPeak, peakRatio(o.ThroughputRatio, o.GuardSaturated && o.CeilingSaturated), minRatio,
			at, gp, cp, mp, pr, mpr)
	}
	fmt.Fprintf(&b, "\nA peak ratio is marked \"(below 0.9)\" when both peaks are saturated and the ratio misses the target. The p99s are those of the highest offered rate at which no ladder of the strategy was saturated; "+
		"a p99 ratio marked ! differs from 1 by more than the run's noise (%.0f%%). Each scenario's section has the ratios at every offered rate.\n", 100*noise.Threshold)

	b.WriteString("\n## Noise\n\n")
	if noise.Pairs == 0 {
		fmt.Fprintf(&b, "Not measured (no repeated steps): p99 differences under %.0f%% are counted as noise.\n", 100*noise.Threshold)
	} else {
		fmt.Fprintf(&b, "Before the ladders, the lowest offered rate (%s req/s) of scenario %s ran several times per target, in alternating order, each run identical "+
			"(its table truncated, fresh keys). The threshold is the 90th percentile of the p99 differences between two identical runs of one target "+
			"(%d pairs), at least %.0f%%: **%.0f%%**. A p99 difference between two steps smaller than that is not told apart from chance. "+
			"It is measured at a low rate; near saturation, where queueing amplifies every hiccup, identical runs differ more.\n\n",
			rate(noise.Offered), noise.Scenario, noise.Pairs, 100*MinNoise, 100*noise.Threshold)
		b.WriteString("| strategy | impl | p99 of each run | range (max ÷ min − 1) |\n|---|---|---|---:|\n")
		for _, sp := range noise.Spreads {
			runs := make([]string, len(sp.P99s))
			for i, p := range sp.P99s {
				runs[i] = ms(p)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %.0f%% |\n", sp.Strategy, sp.Impl, strings.Join(runs, ", "), 100*sp.Range)
		}
	}

	for _, sc := range r.Scenarios() {
		var pattern string
		for _, row := range r.Rows {
			if row.Scenario == sc {
				pattern = row.Pattern
				break
			}
		}
		fmt.Fprintf(&b, "\n## Scenario %s: %s\n\n", sc, pattern)
		if ratios := r.Ratios(sc); len(ratios) > 0 {
			b.WriteString("Ratios at the same offered rate (achieved is about offered while no ladder is saturated, so the throughput ratios matter where one is):\n\n")
			b.WriteString("| strategy | offered | achieved guard ÷ ceiling | achieved ceiling ÷ minimal | p99 guard ÷ ceiling | p99 ceiling ÷ minimal | saturated |\n")
			b.WriteString("|---|---:|---:|---:|---:|---:|---|\n")
			for _, x := range ratios {
				sat := strings.Join(x.Saturated, ", ")
				if sat == "" {
					sat = "-"
				}
				fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", x.Strategy, rate(x.Offered),
					plainRatio(x.GuardCeiling), plainRatio(x.CeilingMinimal),
					p99Ratio(x.P99GuardCeiling, noise.Threshold), p99Ratio(x.P99CeilingMinimal, noise.Threshold), sat)
			}
			b.WriteString("\n")
		}
		b.WriteString("| strategy | impl | offered | achieved | p50 | p90 | p99 | p99.9 | err% | pg stmts/req | tuple writes/req | WAL B/req | redis cmds/req (server) | (client) | executed / replayed / 409 / 422 | status |\n")
		b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
		for _, st := range []string{"table", "hybrid"} {
			for _, impl := range []string{"guard", "ceiling", "minimal"} {
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
- **executed / replayed / 409 / 422**: what the guard decided (the ceiling and the minimal take the same decisions).
- **guard ÷ ceiling**: the guard's Go overhead over its own statements; **ceiling ÷ minimal**: the store's SQL and schema against the least SQL that does the job. Throughput ratios below 1 and p99 ratios above 1 are costs. The minimal's claim returns nothing for a taken key, so in table mode its replays, 409s and 422s take two statements where the store's claim takes one.
`)
	_, err := io.WriteString(w, b.String())
	return err
}

// peakRatio formats a ratio of peaks, flagging a miss of the 0.9 target when
// both peaks are capacities.
func peakRatio(v float64, bothSaturated bool) string {
	if v == 0 {
		return "-"
	}
	if bothSaturated && v < 0.9 {
		return fmt.Sprintf("%.2f (below 0.9)", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func plainRatio(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

// p99Ratio formats a ratio of p99s, marked ! when it differs from 1 by more
// than the noise.
func p99Ratio(v, noise float64) string {
	if v == 0 {
		return "-"
	}
	if v > 1+noise || v*(1+noise) < 1 {
		return fmt.Sprintf("%.2f !", v)
	}
	return fmt.Sprintf("%.2f", v)
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
