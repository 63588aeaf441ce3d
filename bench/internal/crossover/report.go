package crossover

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemguard/idem/bench/internal/cli"
	"github.com/idemguard/idem/bench/internal/target"
)

// Pays is the hybrid ÷ table ratio (median of the rounds) from which the
// lock is said to pay: 5% more saturated throughput.
const Pays = 1.05

// Point is one strategy at one distance and share, over the rounds.
type Point struct {
	Distance, MeasuredRTT time.Duration
	Share                 float64
	Strategy              string
	Rounds                int
	// Medians over the rounds.
	Throughput float64
	P99        time.Duration
	// Over all rounds' requests.
	StatementsPerRequest, PGMicros, ProxyMicros, RedisPerRequest float64
	GuardMicros, RedisMicros                                     float64
	Outcomes                                                     map[string]int64
	Errors                                                       int64
}

// Ratio is hybrid ÷ table at one distance and share: the median of the
// rounds' ratios (each round's two runs were back to back) and their range.
type Ratio struct {
	Distance          time.Duration
	Share             float64
	Median, Low, High float64
	P99               float64 // hybrid p99 ÷ table p99, median of the rounds
}

// Points summarises the cells.
func (r *Result) Points() []Point {
	var out []Point
	for _, d := range r.Config.Distances {
		for _, s := range r.Config.Shares {
			for _, st := range []string{target.Table, target.Hybrid} {
				p := Point{Distance: d, Share: s, Strategy: st, Outcomes: map[string]int64{}}
				var tps []float64
				var p99s []time.Duration
				var req, stmts, cmds int64
				var pg, px, app, rds float64
				for _, c := range r.Cells {
					if c.Lone || c.Distance != d || c.Share != s || c.Strategy != st {
						continue
					}
					p.MeasuredRTT = c.MeasuredRTT
					p.Rounds++
					tps = append(tps, c.Throughput())
					p99s = append(p99s, c.P99)
					req += c.Requests
					stmts += c.PGStatements
					cmds += c.RedisCommands
					pg += c.PGCPU
					px += c.ProxyCPU
					app += c.GuardCPU
					rds += c.RedisCPU
					p.Errors += c.Errors
					for k, v := range c.Outcomes {
						p.Outcomes[k] += v
					}
				}
				if p.Rounds == 0 {
					continue
				}
				p.Throughput = cli.Median(tps)
				slices.Sort(p99s)
				p.P99 = p99s[len(p99s)/2]
				if req > 0 {
					p.StatementsPerRequest = float64(stmts) / float64(req)
					p.RedisPerRequest = float64(cmds) / float64(req)
					p.PGMicros = 1e6 * pg / float64(req)
					p.ProxyMicros = 1e6 * px / float64(req)
					p.GuardMicros = 1e6 * app / float64(req)
					p.RedisMicros = 1e6 * rds / float64(req)
				}
				out = append(out, p)
			}
		}
	}
	return out
}

// Ratios pairs each round's hybrid run with its table run.
func (r *Result) Ratios() []Ratio {
	var out []Ratio
	for _, d := range r.Config.Distances {
		for _, s := range r.Config.Shares {
			byRound := map[int][2]Cell{}
			for _, c := range r.Cells {
				if c.Lone || c.Distance != d || c.Share != s {
					continue
				}
				pair := byRound[c.Round]
				if c.Strategy == target.Table {
					pair[0] = c
				} else {
					pair[1] = c
				}
				byRound[c.Round] = pair
			}
			var tp, p99 []float64
			for _, pair := range byRound {
				if pair[0].Requests == 0 || pair[1].Requests == 0 || pair[0].Throughput() == 0 {
					continue
				}
				tp = append(tp, pair[1].Throughput()/pair[0].Throughput())
				if pair[0].P99 > 0 {
					p99 = append(p99, float64(pair[1].P99)/float64(pair[0].P99))
				}
			}
			if len(tp) == 0 {
				continue
			}
			out = append(out, Ratio{Distance: d, Share: s, Median: cli.Median(tp), Low: slices.Min(tp), High: slices.Max(tp), P99: cli.Median(p99)})
		}
	}
	return out
}

// FirstP50 is the p50 of first executions at 1 caller (new keys only, a
// handler that takes no time) at one distance: each strategy's median over the rounds, and the median of
// the rounds' hybrid ÷ table ratios.
type FirstP50 struct {
	Distance      time.Duration
	Table, Hybrid time.Duration
	Ratio         float64
}

// FirstP50s returns the 1-caller first executions' p50 of every distance
// that has them.
func (r *Result) FirstP50s() []FirstP50 {
	var out []FirstP50
	for _, d := range r.Config.Distances {
		byRound := map[int][2]time.Duration{}
		for _, c := range r.Cells {
			if !c.Lone || c.Distance != d || c.Requests == c.Errors {
				continue
			}
			pair := byRound[c.Round]
			if c.Strategy == target.Table {
				pair[0] = c.P50
			} else {
				pair[1] = c.P50
			}
			byRound[c.Round] = pair
		}
		var table, hybrid, ratio []float64
		for _, pair := range byRound {
			if pair[0] <= 0 || pair[1] <= 0 {
				continue
			}
			table = append(table, float64(pair[0]))
			hybrid = append(hybrid, float64(pair[1]))
			ratio = append(ratio, float64(pair[1])/float64(pair[0]))
		}
		if len(ratio) == 0 {
			continue
		}
		out = append(out, FirstP50{Distance: d, Table: time.Duration(cli.Median(table)), Hybrid: time.Duration(cli.Median(hybrid)), Ratio: cli.Median(ratio)})
	}
	return out
}

// firstP50Line is a distance's FirstP50 in words, or "-" without one.
func (r *Result) firstP50Line(d time.Duration) string {
	for _, f := range r.FirstP50s() {
		if f.Distance == d {
			diff := (f.Hybrid - f.Table).Round(10 * time.Microsecond)
			sign := ""
			if diff >= 0 {
				sign = "+"
			}
			return fmt.Sprintf("table %v, hybrid %v (%s%v, %.2f×)", f.Table.Round(10*time.Microsecond), f.Hybrid.Round(10*time.Microsecond),
				sign, diff, f.Ratio)
		}
	}
	return "-"
}

// stalledShare is the fraction of the run's median busy cores below which a
// round counts as stalled.
const stalledShare = 0.75

// Stalled returns the run's median busy cores and the rounds during which the machine was busy on fewer
// than stalledShare of the run's median busy cores. Throughput follows CPU
// when a round saturates the machine, so such a round was held by something
// else (a checkpoint's writes, the disk under the commits, a stall of the
// proxy): its ratio is in the medians and ranges like any other, and the
// report names it so that a reader can weigh it.
func (r *Result) Stalled() (busy float64, stalled []Cell) {
	var cores []float64
	for _, c := range r.Cells {
		if c.MachineCores > 0 && !c.Lone {
			cores = append(cores, c.MachineCores)
		}
	}
	if len(cores) == 0 {
		return 0, nil
	}
	busy = cli.Median(cores)
	for _, c := range r.Cells {
		if c.MachineCores > 0 && !c.Lone && c.MachineCores < stalledShare*busy {
			stalled = append(stalled, c)
		}
	}
	return busy, stalled
}

// stalledLines describes the stalled rounds, one line each.
func (r *Result) stalledLines() []string {
	busy, cells := r.Stalled()
	var out []string
	for _, c := range cells {
		out = append(out, fmt.Sprintf("%s, %.0f%% retries, %s, round %d: %.2f cores busy (the run's median %.2f), %.0f req/s",
			distLabel(c.Distance), 100*c.Share, c.Strategy, c.Round, c.MachineCores, busy, c.Throughput()))
	}
	return out
}

// Verdict is the sentence for one distance: the lowest share from which
// the hybrid's median ratio is at least Pays at that share and every higher
// one.
func (r *Result) Verdict(d time.Duration) string {
	var from = -1.0
	var ratios []Ratio
	for _, x := range r.Ratios() {
		if x.Distance == d {
			ratios = append(ratios, x)
		}
	}
	slices.SortFunc(ratios, func(a, b Ratio) int {
		switch {
		case a.Share < b.Share:
			return -1
		case a.Share > b.Share:
			return 1
		}
		return 0
	})
	for i := len(ratios) - 1; i >= 0 && ratios[i].Median >= Pays; i-- {
		from = ratios[i].Share
	}
	dist := "over loopback"
	if d > 0 {
		dist = "at +" + d.String() + " round trip"
	}
	if len(ratios) == 0 {
		return dist + ": not measured"
	}
	if from < 0 {
		return fmt.Sprintf("%s: the lock does not pay at any retry share measured (up to %.0f%%; best hybrid ÷ table %.2f)",
			dist, 100*ratios[len(ratios)-1].Share, best(ratios))
	}
	return fmt.Sprintf("%s: the lock pays from %.0f%% retries at this distance", dist, 100*from)
}

func best(rs []Ratio) float64 {
	var b float64
	for _, r := range rs {
		b = max(b, r.Median)
	}
	return b
}

// quantile returns the value at quantile q (0.99 for p99) of sorted: the
// smallest value that at least q of the values do not exceed; 0 for none.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func distLabel(d time.Duration) string {
	if d == 0 {
		return "loopback"
	}
	return "+" + d.String()
}

// Summary prints the ratios and the verdicts.
func (r *Result) Summary(w io.Writer) {
	fmt.Fprintln(w)
	if r.Interrupted {
		fmt.Fprintln(w, "INTERRUPTED: summary of the runs that ended")
	}
	fmt.Fprintf(w, "hybrid ÷ table, saturated throughput by retry share (median of %d rounds):\n", r.Config.Rounds)
	ratios := r.Ratios()
	for _, d := range r.Config.Distances {
		fmt.Fprintf(w, "%-10s", distLabel(d))
		for _, x := range ratios {
			if x.Distance == d {
				fmt.Fprintf(w, " %.0f%% %.2f", 100*x.Share, x.Median)
			}
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "first executions' p50 at 1 caller, new keys only, no handler latency (median of the rounds; hybrid − table, hybrid ÷ table):\n")
	for _, d := range r.Config.Distances {
		fmt.Fprintf(w, "%-10s %s\n", distLabel(d), r.firstP50Line(d))
	}
	for _, d := range r.Config.Distances {
		fmt.Fprintln(w, "verdict: "+r.Verdict(d))
	}
	if lines := r.stalledLines(); len(lines) > 0 {
		fmt.Fprintf(w, "stalled rounds (the machine below %.0f%% of the run's median busy cores: not CPU-bound, held by something else):\n", 100*stalledShare)
		for _, l := range lines {
			fmt.Fprintln(w, "  "+l)
		}
	}
}

// Files the report writes.
const (
	MarkdownFile = "report.md"
	CSVFile      = "crossover.csv"
	PNGFile      = "crossover.png"
)

// Write writes report.md, crossover.csv and crossover.png into dir.
func (r *Result) Write(dir, command string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := r.writeCSV(filepath.Join(dir, CSVFile)); err != nil {
		return err
	}
	var lines []line
	for _, d := range r.Config.Distances {
		l := line{label: distLabel(d)}
		for _, x := range r.Ratios() {
			if x.Distance == d {
				l.share = append(l.share, x.Share)
				l.ratio = append(l.ratio, x.Median)
				l.low = append(l.low, x.Low)
				l.high = append(l.high, x.High)
			}
		}
		lines = append(lines, l)
	}
	if err := plotRatios(filepath.Join(dir, PNGFile), lines); err != nil {
		return err
	}
	var b strings.Builder
	r.markdown(&b, command)
	return os.WriteFile(filepath.Join(dir, MarkdownFile), []byte(b.String()), 0o644)
}

func (r *Result) writeCSV(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write([]string{"distance_us", "measured_rtt_us", "retry_share", "strategy", "round", "callers", "requests", "errors",
		"elapsed_s", "throughput", "p50_us", "p99_us", "pg_statements", "redis_commands", "pg_cpu_s", "proxy_cpu_s",
		"machine_cores", "guard_cpu_s", "redis_cpu_s", "executed", "replayed", "in_progress", "key_reused", "first_error"})
	for _, c := range r.Cells {
		callers := r.Config.Callers
		if c.Lone {
			callers = 1
		}
		_ = w.Write([]string{
			strconv.FormatInt(c.Distance.Microseconds(), 10), strconv.FormatInt(c.MeasuredRTT.Microseconds(), 10),
			ff(c.Share, 2), c.Strategy, strconv.Itoa(c.Round), strconv.Itoa(callers), strconv.FormatInt(c.Requests, 10), strconv.FormatInt(c.Errors, 10),
			ff(c.Elapsed.Seconds(), 3), ff(c.Throughput(), 1), strconv.FormatInt(c.P50.Microseconds(), 10),
			strconv.FormatInt(c.P99.Microseconds(), 10), strconv.FormatInt(c.PGStatements, 10), strconv.FormatInt(c.RedisCommands, 10),
			ff(c.PGCPU, 3), ff(c.ProxyCPU, 3), ff(c.MachineCores, 2), ff(c.GuardCPU, 3), ff(c.RedisCPU, 3),
			strconv.FormatInt(c.Outcomes["executed"], 10), strconv.FormatInt(c.Outcomes["replayed"], 10),
			strconv.FormatInt(c.Outcomes["in_progress"], 10), strconv.FormatInt(c.Outcomes["key_reused"], 10), c.FirstErr,
		})
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func ff(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }

func (r *Result) markdown(w io.Writer, command string) {
	cfg := r.Config
	fmt.Fprintf(w, "# Crossover: from which share of retries does the lock pay?\n\n")
	if r.Interrupted {
		fmt.Fprintf(w, "**Interrupted**: only the runs that ended are reported.\n\n")
	}
	fmt.Fprintf(w, "Command: `%s`  \n", command)
	fmt.Fprintf(w, "Started %s, took %s. %d callers closed loop, handler %v, pgx pool %d, %d rounds of %v per strategy, share and distance, "+
		"each after %d requests of its share that are not measured (the lease and insert modes settle); "+
		"a retry repeats one of the %d latest intents (same key and body).  \n",
		r.Started.UTC().Format(time.RFC3339), r.Finished.Sub(r.Started).Round(time.Second), cfg.Callers, cfg.Work, cfg.PoolSize,
		cfg.Rounds, cfg.Run, cfg.Settle, cfg.Recent)
	var keys []string
	for k := range r.Versions {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var vs []string
	for _, k := range keys {
		vs = append(vs, k+"="+r.Versions[k])
	}
	fmt.Fprintf(w, "Servers: %s.\n\n", strings.Join(vs, ", "))
	fmt.Fprintf(w, "PostgreSQL's distance is added by a delay proxy in its own process (this kernel has no netem); "+
		"loopback runs connect directly. Each round runs the table and the hybrid back to back, in alternating order; "+
		"a ratio is the median of the rounds' ratios (lowest–highest round).\n\n")
	fmt.Fprintf(w, "## Verdict\n\n")
	for _, d := range cfg.Distances {
		fmt.Fprintf(w, "- %s\n", r.Verdict(d))
	}
	fmt.Fprintf(w, "\n(The lock pays where the hybrid's saturated throughput is at least %.2f× the table's at that share and every higher one.)\n\n", Pays)
	fmt.Fprintf(w, "![hybrid ÷ table against retry share](%s)\n\n", PNGFile)
	fmt.Fprintf(w, "## hybrid ÷ table\n\nThe first row is no ratio of throughputs: it is the p50 of first executions with 1 caller "+
		"on new keys only and a handler that takes no time (the guard's own latency), run in every round beside the shares: "+
		"what the lease adds to a request when nothing is saturated.\n\n| retries |")
	for _, d := range cfg.Distances {
		fmt.Fprintf(w, " %s throughput | p99 |", distLabel(d))
	}
	fmt.Fprintf(w, "\n|---|")
	for range cfg.Distances {
		fmt.Fprintf(w, "---|---|")
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "| first execution p50, 1 caller |")
	for _, d := range cfg.Distances {
		fmt.Fprintf(w, " %s | |", r.firstP50Line(d))
	}
	fmt.Fprintln(w)
	ratios := r.Ratios()
	for _, s := range cfg.Shares {
		fmt.Fprintf(w, "| %.0f%% |", 100*s)
		for _, d := range cfg.Distances {
			t, p := "-", "-"
			for _, x := range ratios {
				if x.Distance == d && x.Share == s {
					t, p = fmt.Sprintf("%.2f (%.2f–%.2f)", x.Median, x.Low, x.High), fmt.Sprintf("%.2f", x.P99)
				}
			}
			fmt.Fprintf(w, " %s | %s |", t, p)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\n## Each strategy\n\nMedians over the rounds for throughput and p99; per request over all rounds for the rest. "+
		"PostgreSQL CPU is its backends serving the bench plus its background processes (WAL writer, checkpointer), from /proc; "+
		"guard CPU is the bench process (the guard, its pgx and go-redis clients and the load driver); Redis CPU is INFO cpu; "+
		"proxy CPU is the delay proxy's process. Statements are counted on the client.\n\n")
	fmt.Fprintf(w, "| distance (SELECT 1 RTT) | retries | strategy | req/s | p99 | pg stmts/req | CPU µs/req: pg / guard / Redis / proxy | Redis cmds/req | executed / replayed / 409 / 422 | errors |\n")
	fmt.Fprintf(w, "|---|---:|---|---:|---:|---:|---|---:|---|---:|\n")
	for _, p := range r.Points() {
		fmt.Fprintf(w, "| %s (%v) | %.0f%% | %s | %.0f | %v | %.2f | %.0f / %.0f / %.0f / %.0f | %.2f | %d / %d / %d / %d | %d |\n",
			distLabel(p.Distance), p.MeasuredRTT.Round(time.Microsecond), 100*p.Share, p.Strategy, p.Throughput,
			p.P99.Round(10*time.Microsecond), p.StatementsPerRequest, p.PGMicros, p.GuardMicros, p.RedisMicros, p.ProxyMicros, p.RedisPerRequest,
			p.Outcomes["executed"], p.Outcomes["replayed"], p.Outcomes["in_progress"], p.Outcomes["key_reused"], p.Errors)
	}
	if lines := r.stalledLines(); len(lines) > 0 {
		fmt.Fprintf(w, "\n## Stalled rounds\n\nThroughput follows CPU when a round saturates the machine. These rounds kept it below %.0f%% "+
			"of the run's median busy cores, so something other than CPU held them (a checkpoint's writes, the disk under the commits, "+
			"a stall of the proxy); their ratios are in the medians and ranges above like any other's:\n\n", 100*stalledShare)
		for _, l := range lines {
			fmt.Fprintf(w, "- %s\n", l)
		}
	}
	fmt.Fprintf(w, "\nEvery run is in [%s](%s).\n", CSVFile, CSVFile)
}
