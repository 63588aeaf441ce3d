package report

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Overhead compares the guard with the ceiling of its own statements for one
// scenario and strategy.
type Overhead struct {
	Scenario, Strategy string
	// Peaks are the highest achieved throughputs of each ladder. A ladder
	// that never saturated only shows that it kept up with the highest
	// offered rate.
	GuardPeak, CeilingPeak           float64
	GuardSaturated, CeilingSaturated bool
	// ThroughputRatio is GuardPeak / CeilingPeak.
	ThroughputRatio float64
	// At is the highest offered rate at which neither ladder was saturated;
	// the p99 latencies and their ratio are those of that step. Zero when
	// there is no such rate.
	At                   float64
	GuardP99, CeilingP99 time.Duration
	P99Ratio             float64
}

// Overheads returns the guard's overhead for every scenario and strategy with
// both a guard and a ceiling ladder.
func (r *Report) Overheads() []Overhead {
	var out []Overhead
	for _, sc := range r.Scenarios() {
		for _, st := range []string{"table", "hybrid"} {
			g, c := r.Series(sc, st, "guard"), r.Series(sc, st, "ceiling")
			if len(g) == 0 || len(c) == 0 {
				continue
			}
			o := Overhead{Scenario: sc, Strategy: st}
			o.GuardPeak, o.GuardSaturated = peak(g)
			o.CeilingPeak, o.CeilingSaturated = peak(c)
			if o.CeilingPeak > 0 {
				o.ThroughputRatio = o.GuardPeak / o.CeilingPeak
			}
			for _, gr := range g {
				if gr.Saturated {
					continue
				}
				i := slices.IndexFunc(c, func(cr Row) bool { return cr.Offered == gr.Offered && !cr.Saturated })
				if i < 0 {
					continue
				}
				o.At, o.GuardP99, o.CeilingP99 = gr.Offered, gr.P99, c[i].P99
				if c[i].P99 > 0 {
					o.P99Ratio = float64(gr.P99) / float64(c[i].P99)
				}
			}
			out = append(out, o)
		}
	}
	return out
}

func peak(rows []Row) (best float64, saturated bool) {
	for _, r := range rows {
		best = max(best, r.Achieved)
		saturated = saturated || r.Saturated
	}
	return best, saturated
}

// sustained returns the highest offered rate a ladder kept up with, 0 if none.
func sustained(rows []Row) float64 {
	var best float64
	for _, r := range rows {
		if !r.Saturated {
			best = max(best, r.Offered)
		}
	}
	return best
}

// Verdict is the planner's answer for one scenario: from which offered load
// the hybrid strategy beats the table strategy.
type Verdict struct {
	Scenario string
	DupShare float64
	// P99From and ThroughputFrom are the lowest offered rates from which the
	// hybrid beat the table at every higher rate measured, on p99 latency
	// (at least 10% lower, or the table saturated and the hybrid did not)
	// (lower by more than Noise, or the table saturated and the hybrid did not)
	// and on throughput (at least 5% higher, or the same saturation rule);
	// 0 when it did not.
	P99From, ThroughputFrom float64
	// TableSustained and HybridSustained are the highest offered rates each
	// guard kept up with.
	TableSustained, HybridSustained float64
	// MaxOffered is the highest offered rate either strategy was run at.
	MaxOffered float64
	// Noise is the relative p99 difference below which two steps are not
	// told apart (see [Report.Noise]).
	Noise float64
}

// Noise estimates how much p99 latency differs between two steps for no
// reason but chance on this setup: the 75th percentile, over every offered
// rate at which a guard and the ceiling of its own statements both kept up, of
// |ln(p99 guard / p99 ceiling)|, turned back into a ratio minus one. The
// guard's own overhead (microseconds) is small against these differences, so
// this slightly overstates the noise, which errs on the side of "no
// difference". At least 10%; 25% when fewer than 4 pairs were measured.
func (r *Report) Noise() float64 {
	var logs []float64
	for _, g := range r.Rows {
		if g.Impl != "guard" || g.Saturated || g.Interrupted || g.P99 <= 0 {
			continue
		}
		for _, c := range r.Series(g.Scenario, g.Strategy, "ceiling") {
			if c.Offered == g.Offered && !c.Saturated && c.P99 > 0 {
				logs = append(logs, math.Abs(math.Log(float64(g.P99)/float64(c.P99))))
			}
		}
	}
	if len(logs) < 4 {
		return 0.25
	}
	slices.Sort(logs)
	q := logs[(len(logs)*3)/4]
	return max(0.10, math.Exp(q)-1)
}

// Answer returns a Verdict per scenario that has both strategies' guard
// ladders. The hybrid beats the table on p99 at a rate when its p99 is lower
// by more than the run's Noise, or when only the table saturated there.
func (r *Report) Answer() []Verdict {
	noise := r.Noise()
	var out []Verdict
	for _, sc := range r.Scenarios() {
		t, h := r.Series(sc, "table", "guard"), r.Series(sc, "hybrid", "guard")
		if len(t) == 0 || len(h) == 0 {
			continue
		}
		v := Verdict{Scenario: sc, DupShare: t[0].DupShare, Noise: noise,
			TableSustained: sustained(t), HybridSustained: sustained(h)}
		var rates []float64
		for _, row := range append(slices.Clone(t), h...) {
			if !slices.Contains(rates, row.Offered) {
				rates = append(rates, row.Offered)
			}
		}
		slices.Sort(rates)
		v.MaxOffered = rates[len(rates)-1]
		p99Win := make([]bool, len(rates))
		tputWin := make([]bool, len(rates))
		for i, rate := range rates {
			tr, tok := find(t, rate)
			hr, hok := find(h, rate)
			switch {
			case !hok: // the hybrid's ladder stopped before this rate
			case !tok: // the table's ladder stopped before this rate
				p99Win[i], tputWin[i] = true, true
			default:
				onlyTableSat := tr.Saturated && !hr.Saturated
				p99Win[i] = onlyTableSat || float64(hr.P99)*(1+noise) < float64(tr.P99)
				tputWin[i] = onlyTableSat || hr.Achieved >= 1.05*tr.Achieved
			}
		}
		v.P99From = from(rates, p99Win)
		v.ThroughputFrom = from(rates, tputWin)
		out = append(out, v)
	}
	return out
}

func find(rows []Row, rate float64) (Row, bool) {
	i := slices.IndexFunc(rows, func(r Row) bool { return r.Offered == rate })
	if i < 0 {
		return Row{}, false
	}
	return rows[i], true
}

// from returns the lowest rate from which win holds up to the last rate.
func from(rates []float64, win []bool) float64 {
	f := 0.0
	for i := len(rates) - 1; i >= 0 && win[i]; i-- {
		f = rates[i]
	}
	return f
}

// Text says the verdict in one sentence.
func (v Verdict) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (%.0f%% retries): ", v.Scenario, 100*v.DupShare)
	switch {
	case v.P99From == 0 && v.ThroughputFrom == 0:
		fmt.Fprintf(&b, "the hybrid did not beat the table, on p99 or on throughput, at any offered load up to %s req/s on this setup", rate(v.MaxOffered))
	default:
		var parts []string
		if v.P99From > 0 {
			parts = append(parts, "on p99 from "+rate(v.P99From)+" req/s offered")
		} else {
			parts = append(parts, "not on p99")
		}
		if v.ThroughputFrom > 0 {
			parts = append(parts, "on throughput from "+rate(v.ThroughputFrom)+" req/s offered")
		} else {
			parts = append(parts, "not on throughput")
		}
		b.WriteString("the hybrid beat the table " + strings.Join(parts, ", and "))
	}
	fmt.Fprintf(&b, ". Highest load kept up with: table %s req/s, hybrid %s req/s (p99 differences under %.0f%% counted as noise).",
		orNone(v.TableSustained), orNone(v.HybridSustained), 100*v.Noise)
	return b.String()
}

func rate(r float64) string { return fmt.Sprintf("%.0f", r) }

func orNone(r float64) string {
	if r == 0 {
		return "none of the offered rates"
	}
	return rate(r)
}
