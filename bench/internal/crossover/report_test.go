package crossover

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/bench/internal/target"
)

// result builds a sweep where the hybrid's throughput over the table's is
// ratio(distance, share) in every round.
func result(ratio func(d time.Duration, share float64) float64) *Result {
	cfg := Config{Shares: []float64{0, 0.5, 0.95}, Distances: []time.Duration{0, 2 * time.Millisecond}, Rounds: 2}
	r := &Result{Config: cfg}
	for _, d := range cfg.Distances {
		for _, s := range cfg.Shares {
			for round := 1; round <= cfg.Rounds; round++ {
				table := Cell{Distance: d, Share: s, Strategy: target.Table, Round: round, Requests: 1000, Elapsed: time.Second, P99: 10 * time.Millisecond,
					MachineCores: 1.8}
				hybrid := table
				hybrid.Strategy = target.Hybrid
				hybrid.Requests = int64(1000 * ratio(d, s))
				r.Cells = append(r.Cells, table, hybrid)
			}
		}
		// Each round's 1-caller first executions: the hybrid 0.2 ms slower
		// in round 1, 0.3 ms in round 2; their throughput is no share's.
		for round := 1; round <= cfg.Rounds; round++ {
			table := Cell{Distance: d, Strategy: target.Table, Round: round, Lone: true, Requests: 10, Elapsed: time.Second,
				P50: time.Millisecond, MachineCores: 0.3}
			hybrid := table
			hybrid.Strategy = target.Hybrid
			hybrid.P50 += time.Duration(round+1) * 100 * time.Microsecond
			r.Cells = append(r.Cells, table, hybrid)
		}
	}
	return r
}

// The 1-caller first executions are reported apart: their p50 per
// strategy, median of the rounds, and never in a share's ratio or among the
// stalled rounds.
func TestFirstP50s(t *testing.T) {
	r := result(func(time.Duration, float64) float64 { return 1.1 })
	f := r.FirstP50s()
	require.Len(t, f, 2)
	require.Equal(t, FirstP50{Distance: 0, Table: time.Millisecond, Hybrid: 1250 * time.Microsecond, Ratio: 1.25}, f[0])
	for _, x := range r.Ratios() {
		require.InDelta(t, 1.1, x.Median, 1e-9, "share %v", x.Share)
	}
	for _, p := range r.Points() {
		require.EqualValues(t, 2, p.Rounds)
	}
	_, stalled := r.Stalled()
	require.Empty(t, stalled, "a 1-caller run leaves the machine idle by design")

	var b strings.Builder
	r.Summary(&b)
	require.Contains(t, b.String(), "loopback   table 1ms, hybrid 1.25ms (+250µs, 1.25×)")
	dir := t.TempDir()
	require.NoError(t, r.Write(dir, "go run ./bench crossover"))
	md, err := os.ReadFile(filepath.Join(dir, MarkdownFile))
	require.NoError(t, err)
	require.Contains(t, string(md), "| first execution p50, 1 caller | table 1ms, hybrid 1.25ms (+250µs, 1.25×) | |")
	csv, err := os.ReadFile(filepath.Join(dir, CSVFile))
	require.NoError(t, err)
	require.Contains(t, string(csv), ",hybrid,2,1,10,0,")
}

func TestVerdict(t *testing.T) {
	r := result(func(d time.Duration, share float64) float64 {
		switch {
		case d == 0:
			return 0.9 // never pays over loopback
		case share >= 0.5:
			return 1.5
		}
		return 0.95
	})
	require.Equal(t, "over loopback: the lock does not pay at any retry share measured (up to 95%; best hybrid ÷ table 0.90)", r.Verdict(0))
	require.Equal(t, "at +2ms round trip: the lock pays from 50% retries at this distance", r.Verdict(2*time.Millisecond))

	// A share that pays below one that does not is not a crossover.
	r = result(func(_ time.Duration, share float64) float64 {
		if share == 0.5 {
			return 0.8
		}
		return 1.2
	})
	require.Equal(t, "over loopback: the lock pays from 95% retries at this distance", r.Verdict(0))
}

func TestWrite(t *testing.T) {
	r := result(func(time.Duration, float64) float64 { return 1.1 })
	dir := t.TempDir()
	require.NoError(t, r.Write(dir, "go run ./bench crossover"))
	for _, f := range []string{MarkdownFile, CSVFile, PNGFile} {
		require.FileExists(t, filepath.Join(dir, f))
	}
	for _, x := range r.Ratios() {
		require.InDelta(t, 1.1, x.Median, 1e-9)
	}
}

// A round that kept the machine well below the run's usual busy cores is
// named as stalled, in the summary and in the report; the others are not.
func TestStalledRounds(t *testing.T) {
	r := result(func(time.Duration, float64) float64 { return 1 })
	_, stalled := r.Stalled()
	require.Empty(t, stalled, "every round as busy as the others")

	r.Cells[5].MachineCores = 0.6 // +0s, 50%, hybrid, round 1 (table, hybrid per round, shares first)
	busy, stalled := r.Stalled()
	require.InDelta(t, 1.8, busy, 1e-9)
	require.Len(t, stalled, 1)
	require.Equal(t, r.Cells[5], stalled[0])

	var b strings.Builder
	r.Summary(&b)
	require.Contains(t, b.String(), "loopback, 50% retries, hybrid, round 1: 0.60 cores busy (the run's median 1.80)")
	dir := t.TempDir()
	require.NoError(t, r.Write(dir, "go run ./bench crossover"))
	md, err := os.ReadFile(filepath.Join(dir, MarkdownFile))
	require.NoError(t, err)
	require.Contains(t, string(md), "## Stalled rounds")
	require.Contains(t, string(md), "- loopback, 50% retries, hybrid, round 1: 0.60 cores busy")
}

func TestQuantile(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 1000; i++ {
		ds = append(ds, time.Duration(i)*time.Microsecond)
	}
	require.Equal(t, 500*time.Microsecond, quantile(ds, 0.5))
	require.Equal(t, 990*time.Microsecond, quantile(ds, 0.99))
	require.Equal(t, 1000*time.Microsecond, quantile(ds, 1))
	require.Equal(t, time.Microsecond, quantile(ds, 0))
	require.Equal(t, 7*time.Millisecond, quantile([]time.Duration{7 * time.Millisecond}, 0.99))
	require.Zero(t, quantile(nil, 0.5))
}
