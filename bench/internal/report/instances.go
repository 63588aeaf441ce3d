package report

import (
	"cmp"
	"encoding/csv"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// InstancesCSV is the file Write adds when the run drove worker processes.
const InstancesCSV = "instances.csv"

// CPU is what each part of the system used during a step, in cores (1.0 is
// one core busy for the whole step).
type CPU struct {
	Driver   float64 // the bench process: open-loop driver and HTTP client
	Workers  float64 // the worker processes, summed
	Postgres float64 // the server's processes serving the fleet: its backends and the background ones
	Redis    float64 // the Redis server (INFO cpu)
	// Programs is every other process (other programs, other clients'
	// PostgreSQL backends); Interrupts the kernel's irq and softirq time.
	Programs, Interrupts float64
	Machine              float64 // every CPU's busy time (/proc/stat)
	Cores                int
	// Known is false when /proc could not be read: only Redis is filled in.
	Known bool
}

// Other is the machine's busy time not accounted for by the fleet's parts:
// other programs, interrupts, and processes that came and went within the
// step.
func (c CPU) Other() float64 {
	return max(0, c.Machine-c.Driver-c.Workers-c.Postgres-c.Redis)
}

// InstanceRow is one step of the many-instance ladders: the guard of one
// strategy served over HTTP by Instances worker processes, each with its
// own pgx pool and Redis client, all on the same schema and Redis.
type InstanceRow struct {
	Row
	Instances int
	// PoolPerInstance is each worker's pgx pool size.
	PoolPerInstance int
	// PerInstance is how many requests each worker answered.
	PerInstance []int64
	// Executions is how many times the handler ran, over all workers;
	// Intents how many distinct intents the step sent; Doubles how many
	// intents the handler ran more than once (0 unless the guard failed).
	Executions, Intents, Doubles int64
	CPU                          CPU
}

// InstanceSeries returns the steps of one scenario, strategy and instance
// count, by offered rate, without interrupted steps.
func (r *Report) InstanceSeries(scenario, strategy string, instances int) []InstanceRow {
	var out []InstanceRow
	for _, row := range r.Instances {
		if row.Scenario == scenario && row.Strategy == strategy && row.Instances == instances && !row.Interrupted {
			out = append(out, row)
		}
	}
	slices.SortStableFunc(out, func(a, b InstanceRow) int { return cmp.Compare(a.Offered, b.Offered) })
	return out
}

// InstanceCounts returns the instance counts present, ascending.
func (r *Report) InstanceCounts() []int {
	out := distinct(r.Instances, func(row InstanceRow) int { return row.Instances })
	slices.Sort(out)
	return out
}

// instanceScenarios returns the scenarios of the many-instance ladders, in
// order of first appearance.
func (r *Report) instanceScenarios() []string {
	return distinct(r.Instances, func(row InstanceRow) string { return row.Scenario })
}

// Scaling sums up one ladder of the many-instance run.
type Scaling struct {
	Scenario, Strategy string
	Instances          int
	// Peak is the highest achieved throughput; Saturated says whether the
	// ladder saturated (Peak is then its capacity).
	Peak      float64
	Saturated bool
	// Kept is the highest offered rate the ladder kept up with, and P99
	// the p99 there; 0 when it saturated at its first step.
	Kept float64
	P99  time.Duration
	// At is the step whose CPU is shown: the saturated one, else the last.
	At InstanceRow
}

// Scalings returns a Scaling per scenario, strategy and instance count.
func (r *Report) Scalings() []Scaling {
	var out []Scaling
	for _, sc := range r.instanceScenarios() {
		for _, st := range []string{"table", "hybrid"} {
			for _, n := range r.InstanceCounts() {
				rows := r.InstanceSeries(sc, st, n)
				if len(rows) == 0 {
					continue
				}
				s := Scaling{Scenario: sc, Strategy: st, Instances: n, At: rows[len(rows)-1]}
				for _, row := range rows {
					s.Peak = max(s.Peak, row.Achieved)
					if row.Saturated {
						s.Saturated = true
						s.At = row
						break
					}
					s.Kept, s.P99 = row.Offered, row.P99
				}
				out = append(out, s)
			}
		}
	}
	return out
}

// Bound says what limited a step, from its CPU figures: the machine's cores
// when they were at least 90% busy (naming the biggest user), else waiting
// (connections, commit flushes, locks), which CPU figures cannot tell apart.
func (c CPU) Bound() string {
	if !c.Known || c.Cores == 0 {
		return "unknown (no /proc)"
	}
	parts := []struct {
		name string
		v    float64
	}{{"postgres", c.Postgres}, {"workers", c.Workers}, {"driver", c.Driver}, {"redis", c.Redis},
		{"other programs", c.Programs}, {"interrupts", c.Interrupts}}
	slices.SortStableFunc(parts, func(a, b struct {
		name string
		v    float64
	}) int {
		switch {
		case a.v > b.v:
			return -1
		case a.v < b.v:
			return 1
		}
		return 0
	})
	if c.Machine >= 0.9*float64(c.Cores) {
		return fmt.Sprintf("CPU: %.2f of %d cores busy, most by %s (%.2f) then %s (%.2f)",
			c.Machine, c.Cores, parts[0].name, parts[0].v, parts[1].name, parts[1].v)
	}
	return fmt.Sprintf("not CPU (%.2f of %d cores busy): waiting on connections, commits or locks", c.Machine, c.Cores)
}

func cores(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

func perInstance(v []int64) string {
	parts := make([]string, len(v))
	for i, n := range v {
		parts[i] = strconv.FormatInt(n, 10)
	}
	return strings.Join(parts, " / ")
}

// writeInstancesMarkdown writes the "Many instances" section.
func (r *Report) writeInstancesMarkdown(b *strings.Builder) {
	if len(r.Instances) == 0 {
		return
	}
	b.WriteString("\n## Many instances\n\n")
	fmt.Fprintf(b, "The guard (the HTTP middleware in front of the same %v handler as the in-process target) ran in N separate worker processes "+
		"(N = %s), each with its own pgx pool and Redis client, on one schema and one Redis. The bench spread the open-loop load over them over HTTP "+
		"(keep-alive): new intents round-robin, each retry of an intent to the next worker. The pgx pool of %d connections is divided among the workers "+
		"(so the total stays the same whatever N; see the pool column). CPU is in cores (1.00 = one core busy for the whole step), measured per step: "+
		"driver = the bench process, workers = their sum, postgres = the server's processes that serve the workers (their backends, and the WAL writer, checkpointer and other background processes; not other clients' backends), redis = the server's INFO cpu, "+
		"other = every other process on the machine (other programs, other clients' PostgreSQL backends), irq = the kernel's interrupt and softirq time (loopback networking among it), machine = all busy CPUs (%d cores), including processes that came and went within the step.\n\n",
		r.Setup.Work, intsList(r.InstanceCounts()), r.Setup.PoolSize, r.Setup.CPUs)
	b.WriteString("| scenario | strategy | instances | peak achieved req/s | kept up with (offered) | p99 there | CPU at the saturated (else last) step: driver / workers / postgres / redis / other / irq / machine | bound |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---|---|\n")
	for _, s := range r.Scalings() {
		kept, p99 := "-", "-"
		if s.Kept > 0 {
			kept, p99 = rate(s.Kept), ms(s.P99)
		}
		c := s.At.CPU
		fmt.Fprintf(b, "| %s | %s | %d | %s%s | %s | %s | %s / %s / %s / %s / %s / %s / %s | %s |\n",
			s.Scenario, s.Strategy, s.Instances, rate(s.Peak), satMark(s.Saturated), kept, p99,
			cores(c.Driver), cores(c.Workers), cores(c.Postgres), cores(c.Redis), cores(c.Programs), cores(c.Interrupts), cores(c.Machine), c.Bound())
	}
	fmt.Fprintf(b, "\n(* saturated: the peak is that ladder's capacity.)\n\n![achieved against offered throughput, per instance count](%s)\n", InstancesPlot)
	for _, sc := range r.instanceScenarios() {
		var pattern string
		for _, row := range r.Instances {
			if row.Scenario == sc {
				pattern = row.Pattern
				break
			}
		}
		fmt.Fprintf(b, "\n### Many instances, %s: %s\n\n", sc, pattern)
		b.WriteString("| strategy | instances | pool each | offered | achieved | p50 | p99 | p99.9 | err% | requests per instance | executions / intents / doubles | executed / replayed / 409 / 422 | pg stmts/req | CPU driver | workers | postgres | redis | other | irq | machine | status |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
		for _, st := range []string{"table", "hybrid"} {
			for _, n := range r.InstanceCounts() {
				for _, row := range r.InstanceSeries(sc, st, n) {
					status := "ok"
					if row.Saturated {
						status = "saturated: " + row.Note
					}
					c := row.CPU
					fmt.Fprintf(b, "| %s | %d | %d | %.0f | %.0f | %s | %s | %s | %.2f | %s | %d / %d / %d | %d / %d / %d / %d | %.2f | %s | %s | %s | %s | %s | %s | %s | %s |\n",
						row.Strategy, row.Instances, row.PoolPerInstance, row.Offered, row.Achieved, ms(row.P50), ms(row.P99), ms(row.P999),
						100*row.ErrorRate(), perInstance(row.PerInstance), row.Executions, row.Intents, row.Doubles,
						row.Executed, row.Replayed, row.InProgress, row.KeyReused, row.PGStatements,
						cores(c.Driver), cores(c.Workers), cores(c.Postgres), cores(c.Redis), cores(c.Programs), cores(c.Interrupts), cores(c.Machine), status)
				}
			}
		}
	}
	b.WriteString("\n**executions / intents / doubles**: how many times the handler ran (counted in the workers), how many distinct intents the step sent, " +
		"and how many intents ran more than once across the fleet (0 unless the guard failed). Under a storm, executions equal intents when every intent ran once. " +
		"Other, irq and machine count every program on the machine: on a machine shared with other work they show how much of the CPU the fleet had.\n")
}

func intsList(v []int) string {
	parts := make([]string, len(v))
	for i, n := range v {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ", ")
}

var instancesHeader = []string{
	"scenario", "pattern", "strategy", "instances", "pool_per_instance", "offered_rps", "achieved_rps",
	"p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms", "service_p50_ms", "service_p99_ms",
	"requests", "errors", "dropped", "executed", "replayed", "in_progress", "key_reused",
	"requests_per_instance", "handler_executions", "intents", "double_executions",
	"pg_statements_per_req", "pg_tuple_writes_per_req", "wal_bytes_per_req",
	"redis_server_cmds_per_req", "redis_client_cmds_per_req",
	"cpu_driver", "cpu_workers", "cpu_postgres", "cpu_redis", "cpu_other_programs", "cpu_interrupts", "cpu_unattributed", "cpu_machine", "cores",
	"saturated", "interrupted", "note",
}

// WriteInstancesCSV writes one line per step of the many-instance ladders,
// durations in milliseconds, CPU in cores.
func (r *Report) WriteInstancesCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(instancesHeader); err != nil {
		return err
	}
	for _, row := range r.Instances {
		c := row.CPU
		rec := []string{
			row.Scenario, row.Pattern, row.Strategy, strconv.Itoa(row.Instances), strconv.Itoa(row.PoolPerInstance),
			f(row.Offered, 1), f(row.Achieved, 1),
			msf(row.P50), msf(row.P90), msf(row.P99), msf(row.P999), msf(row.Max), msf(row.SvcP50), msf(row.SvcP99),
			strconv.FormatInt(row.Requests, 10), strconv.FormatInt(row.Errors, 10), strconv.FormatInt(row.Dropped, 10),
			strconv.FormatInt(row.Executed, 10), strconv.FormatInt(row.Replayed, 10),
			strconv.FormatInt(row.InProgress, 10), strconv.FormatInt(row.KeyReused, 10),
			strings.ReplaceAll(perInstance(row.PerInstance), " / ", ";"),
			strconv.FormatInt(row.Executions, 10), strconv.FormatInt(row.Intents, 10), strconv.FormatInt(row.Doubles, 10),
			f(row.PGStatements, 3), f(row.TupleWrites, 3), f(row.WALBytes, 0), f(row.RedisServer, 3), f(row.RedisClient, 3),
			f(c.Driver, 3), f(c.Workers, 3), f(c.Postgres, 3), f(c.Redis, 3), f(c.Programs, 3), f(c.Interrupts, 3),
			f(max(0, c.Other()-c.Programs-c.Interrupts), 3), f(c.Machine, 3), strconv.Itoa(c.Cores),
			strconv.FormatBool(row.Saturated), strconv.FormatBool(row.Interrupted), row.Note,
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// InstanceLine is the fixed-width progress line of a many-instance step.
func InstanceLine(r InstanceRow) string {
	status := "ok"
	switch {
	case r.Interrupted:
		status = "interrupted"
	case r.Saturated:
		status = "SATURATED: " + r.Note
	}
	c := r.CPU
	return fmt.Sprintf("%-8s %-8s %4d %8.0f %8.0f %9s %9s %6.2f %9s %5d %5.2f %5.2f %5.2f %5.2f %5.2f %5.2f %5.2f  %s",
		r.Scenario, r.Strategy, r.Instances, r.Offered, r.Achieved, ms(r.P50), ms(r.P99), 100*r.ErrorRate(),
		fmt.Sprintf("%d/%d", r.Executions, r.Intents), r.Doubles,
		c.Driver, c.Workers, c.Postgres, c.Redis, c.Programs, c.Interrupts, c.Machine, status)
}

// InstanceHeader is the header of InstanceLine.
func InstanceHeader() string {
	return fmt.Sprintf("%-8s %-8s %4s %8s %8s %9s %9s %6s %9s %5s %5s %5s %5s %5s %5s %5s %5s  %s",
		"scenario", "strategy", "inst", "offered", "achieved", "p50", "p99", "err%", "exec/int", "dbl",
		"drv", "wrk", "pg", "rds", "oth", "irq", "mach", "status (CPU in cores)")
}

// WriteInstancesSummary prints the many-instance run's summary: per
// scenario, strategy and instance count, the peak and what bounded it.
func (r *Report) WriteInstancesSummary(w io.Writer) {
	fmt.Fprintln(w)
	if r.Setup.Interrupted {
		fmt.Fprintln(w, "INTERRUPTED: summary of the steps that ran")
	}
	fmt.Fprintf(w, "summary (%s): many instances, peaks in req/s (* saturated), CPU in cores at the saturated (else last) step\n",
		r.Setup.Finished.Sub(r.Setup.Started).Round(time.Second))
	fmt.Fprintf(w, "%-8s %-8s %4s %9s %8s %9s  %s\n", "scenario", "strategy", "inst", "peak", "kept", "p99", "bound")
	for _, s := range r.Scalings() {
		kept, p99 := "-", "-"
		if s.Kept > 0 {
			kept, p99 = rate(s.Kept), ms(s.P99)
		}
		fmt.Fprintf(w, "%-8s %-8s %4d %8.0f%s %8s %9s  %s\n", s.Scenario, s.Strategy, s.Instances, s.Peak, satMark(s.Saturated)+strings.Repeat(" ", 1-len(satMark(s.Saturated))), kept, p99, s.At.CPU.Bound())
	}
}

// InstancesPlot is the plot Write draws for a many-instance run.
const InstancesPlot = "instances.png"

// PlotInstances draws achieved against offered throughput of the
// many-instance ladders, one panel per scenario, a colour per strategy and
// a line style per instance count, both axes logarithmic, into a PNG file.
func (r *Report) PlotInstances(path string) error {
	scenarios := r.instanceScenarios()
	if len(scenarios) == 0 {
		scenarios = []string{"(no data)"}
	}
	dashes := [][]vg.Length{nil, {vg.Points(5), vg.Points(3)}, {vg.Points(1.5), vg.Points(2.5)}, {vg.Points(8), vg.Points(2), vg.Points(2), vg.Points(2)}}
	glyphs := []draw.GlyphDrawer{draw.CircleGlyph{}, draw.BoxGlyph{}, draw.TriangleGlyph{}, draw.CrossGlyph{}}
	var panels []*plot.Plot
	for _, sc := range scenarios {
		p := plot.New()
		p.Title.Text = "many instances: " + sc
		p.X.Label.Text = "offered (req/s)"
		p.Y.Label.Text = "achieved (req/s)"
		p.Add(plotter.NewGrid())
		p.Legend.Top, p.Legend.Left = true, true
		var offered []float64
		for _, st := range []string{"table", "hybrid"} {
			c := tableColor
			if st == "hybrid" {
				c = hybridColor
			}
			for k, n := range r.InstanceCounts() {
				var pts plotter.XYs
				for _, row := range r.InstanceSeries(sc, st, n) {
					if row.Offered > 0 && row.Achieved > 0 {
						pts = append(pts, plotter.XY{X: row.Offered, Y: row.Achieved})
						if !slices.Contains(offered, row.Offered) {
							offered = append(offered, row.Offered)
						}
					}
				}
				if len(pts) == 0 {
					continue
				}
				line, points, err := plotter.NewLinePoints(pts)
				if err != nil {
					return err
				}
				line.Color, points.Color = c, c
				line.Width = vg.Points(1.5)
				line.Dashes = dashes[k%len(dashes)]
				points.Shape = glyphs[k%len(glyphs)]
				p.Add(line, points)
				p.Legend.Add(fmt.Sprintf("%s ×%d", st, n), line, points)
			}
		}
		if len(offered) > 0 {
			lo, hi := slices.Min(offered), slices.Max(offered)
			p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
			p.X.Tick.Marker, p.Y.Tick.Marker = fixedTicks(offered), ticks125{}
			p.X.Min, p.X.Max = lo/1.15, hi*1.15
			p.Y.Max *= 4 // room for the legend
			if err := addOffered(p, lo, hi); err != nil {
				return err
			}
		}
		panels = append(panels, p)
	}
	return writePanels(path, panels)
}
