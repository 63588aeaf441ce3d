package report

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Overhead compares, for one scenario and strategy, the guard with the
// ceiling of its own statements (the guard's Go overhead), and the ceiling
// with the minimal SQL on the minimal table (the cost of the store's SQL and
// schema against the bare job).
type Overhead struct {
	Scenario, Strategy string
	// Peaks are the highest achieved throughputs of each ladder. A ladder
	// that never saturated only shows that it kept up with the highest
	// offered rate. MinimalPeak is 0 when the run had no minimal ladder.
	GuardPeak, CeilingPeak, MinimalPeak                float64
	GuardSaturated, CeilingSaturated, MinimalSaturated bool
	// ThroughputRatio is GuardPeak / CeilingPeak; MinimalRatio is
	// CeilingPeak / MinimalPeak, 0 without a minimal ladder.
	ThroughputRatio, MinimalRatio float64
	// At is the highest offered rate at which none of the ladders was
	// saturated; the p99 latencies and their ratios are those of that step.
	// Zero when there is no such rate.
	At                               float64
	GuardP99, CeilingP99, MinimalP99 time.Duration
	// P99Ratio is GuardP99 / CeilingP99; MinimalP99Ratio is CeilingP99 /
	// MinimalP99, 0 without a minimal ladder.
	P99Ratio, MinimalP99Ratio float64
}

// Overheads returns the overheads of every scenario and strategy with both a
// guard and a ceiling ladder; the minimal's figures are filled in when it
// ran too.
func (r *Report) Overheads() []Overhead {
	var out []Overhead
	for _, sc := range r.Scenarios() {
		for _, st := range []string{"table", "hybrid"} {
			g, c, m := r.Series(sc, st, "guard"), r.Series(sc, st, "ceiling"), r.Series(sc, st, "minimal")
			if len(g) == 0 || len(c) == 0 {
				continue
			}
			o := Overhead{Scenario: sc, Strategy: st}
			o.GuardPeak, o.GuardSaturated = peak(g)
			o.CeilingPeak, o.CeilingSaturated = peak(c)
			o.ThroughputRatio = ratio(o.GuardPeak, o.CeilingPeak)
			if len(m) > 0 {
				o.MinimalPeak, o.MinimalSaturated = peak(m)
				o.MinimalRatio = ratio(o.CeilingPeak, o.MinimalPeak)
			}
			for _, gr := range g {
				cr, ok := find(c, gr.Offered)
				if gr.Saturated || !ok || cr.Saturated {
					continue
				}
				mr, mok := find(m, gr.Offered)
				if len(m) > 0 && (!mok || mr.Saturated) {
					continue
				}
				o.At, o.GuardP99, o.CeilingP99 = gr.Offered, gr.P99, cr.P99
				o.P99Ratio = ratio(float64(gr.P99), float64(cr.P99))
				if mok {
					o.MinimalP99 = mr.P99
					o.MinimalP99Ratio = ratio(float64(cr.P99), float64(mr.P99))
				}
			}
			out = append(out, o)
		}
	}
	return out
}

// RateRatios compares the implementations of one strategy at one offered
// rate of one scenario: the ratios of their achieved throughputs and p99
// latencies, at the same offered rate. A ratio is 0 when one of its two steps
// did not run (its ladder had stopped).
type RateRatios struct {
	Scenario, Strategy string
	Offered            float64
	// Achieved: guard / ceiling and ceiling / minimal.
	GuardCeiling, CeilingMinimal float64
	// p99: guard / ceiling and ceiling / minimal.
	P99GuardCeiling, P99CeilingMinimal float64
	// Saturated lists the implementations saturated at this rate.
	Saturated []string
}

// Ratios returns the ratios of every strategy at every offered rate of
// scenario at which the guard and the ceiling, or the ceiling and the
// minimal, both ran.
func (r *Report) Ratios(scenario string) []RateRatios {
	var out []RateRatios
	for _, st := range []string{"table", "hybrid"} {
		g, c, m := r.Series(scenario, st, "guard"), r.Series(scenario, st, "ceiling"), r.Series(scenario, st, "minimal")
		for _, cr := range c {
			gr, gok := find(g, cr.Offered)
			mr, mok := find(m, cr.Offered)
			if !gok && !mok {
				continue
			}
			x := RateRatios{Scenario: scenario, Strategy: st, Offered: cr.Offered}
			if gok {
				x.GuardCeiling = ratio(gr.Achieved, cr.Achieved)
				x.P99GuardCeiling = ratio(float64(gr.P99), float64(cr.P99))
				if gr.Saturated {
					x.Saturated = append(x.Saturated, "guard")
				}
			}
			if cr.Saturated {
				x.Saturated = append(x.Saturated, "ceiling")
			}
			if mok {
				x.CeilingMinimal = ratio(cr.Achieved, mr.Achieved)
				x.P99CeilingMinimal = ratio(float64(cr.P99), float64(mr.P99))
				if mr.Saturated {
					x.Saturated = append(x.Saturated, "minimal")
				}
			}
			out = append(out, x)
		}
	}
	return out
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
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
	// told apart (see [Report.Noise]'s Threshold).
	Noise float64
}

// Noise is how much the p99 latency of two identical steps differs for no
// reason but chance on this setup, measured in the run itself.
type Noise struct {
	// Threshold is the relative p99 difference below which two steps are
	// not told apart: the 90th percentile, over every pair of identical
	// runs of one target, of |ln(p99 a / p99 b)|, turned back into a ratio
	// minus one; at least MinNoise. DefaultNoise when not measured.
	Threshold float64
	// Pairs is the number of pairs of identical runs it comes from; 0
	// when the run had no repeats (Threshold is then DefaultNoise).
	Pairs int
	// Scenario and Offered say which step was repeated.
	Scenario string
	Offered  float64
	// Spreads are each target's runs.
	Spreads []Spread
}

// Spread is the p99 of each identical run of one target, and their range:
// max / min - 1.
type Spread struct {
	Strategy, Impl string
	P99s           []time.Duration
	Range          float64
}

// Bounds of the noise threshold: a floor below which a p99 difference is
// never counted (HdrHistogram's precision and timer jitter), and the
// threshold used when no repeats ran.
const (
	MinNoise     = 0.05
	DefaultNoise = 0.25
)

// Noise estimates the run's p99 noise from its Repeats: the same step
// (scenario, offered rate, target) run several times. Runs that saturated or
// were interrupted are left out.
func (r *Report) Noise() Noise {
	n := Noise{Threshold: DefaultNoise}
	type target struct{ strategy, impl string }
	var order []target
	runs := map[target][]time.Duration{}
	for _, row := range r.Repeats {
		n.Scenario, n.Offered = row.Scenario, row.Offered
		if row.Saturated || row.Interrupted || row.P99 <= 0 {
			continue
		}
		k := target{row.Strategy, row.Impl}
		if _, ok := runs[k]; !ok {
			order = append(order, k)
		}
		runs[k] = append(runs[k], row.P99)
	}
	var logs []float64
	for _, k := range order {
		p := runs[k]
		for i := range p {
			for j := i + 1; j < len(p); j++ {
				logs = append(logs, math.Abs(math.Log(float64(p[i])/float64(p[j]))))
			}
		}
		n.Spreads = append(n.Spreads, Spread{Strategy: k.strategy, Impl: k.impl, P99s: p,
			Range: float64(slices.Max(p))/float64(slices.Min(p)) - 1})
	}
	if len(logs) == 0 {
		return n
	}
	slices.Sort(logs)
	n.Pairs = len(logs)
	n.Threshold = max(MinNoise, math.Exp(logs[int(0.9*float64(len(logs)-1)+0.5)])-1)
	return n
}

// Answer returns a Verdict per scenario that has both strategies' guard
// ladders. The hybrid beats the table on p99 at a rate when its p99 is lower
// by more than the run's Noise, or when only the table saturated there.
func (r *Report) Answer() []Verdict {
	noise := r.Noise().Threshold
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
