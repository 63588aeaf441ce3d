package report

import (
	"encoding/csv"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func row(sc, st, impl string, offered, achieved float64, p99 time.Duration, sat bool) Row {
	return Row{
		Scenario: sc, Pattern: sc + " pattern", Strategy: st, Impl: impl,
		Offered: offered, Achieved: achieved,
		P50: p99 / 2, P90: p99 * 3 / 4, P99: p99, P999: p99 * 2, Max: p99 * 3,
		Requests: int64(achieved), Executed: int64(achieved),
		PGStatements: 2, TupleWrites: 2, WALBytes: 300, RedisServer: 4, RedisClient: 2,
		Saturated: sat,
	}
}

// sample: the table saturates at 4000 in "unique"; in "storm" the hybrid is
// clearly faster from 2000 on.
func sample() *Report {
	ms := time.Millisecond
	return &Report{
		Setup: Setup{
			Command: "go run ./bench", Started: time.Unix(0, 0), Finished: time.Unix(65, 0),
			CPUs: 2, GOMAXPROCS: 2, OS: "linux", Arch: "amd64", GoVersion: "go1.26",
			Servers: map[string]string{"postgres_server_version": "15.2"},
			Step:    time.Second, Drain: time.Second, Rates: []float64{1000, 2000, 4000},
			MaxInFlight: 256, PoolSize: 16, Work: 5 * ms, Dup: 0.2, StormK: 5, StormWindow: 20 * ms,
			MaxP99: 250 * ms, StatsExact: true,
		},
		Rows: []Row{
			row("unique", "table", "guard", 1000, 995, 10*ms, false),
			row("unique", "table", "ceiling", 1000, 996, 10*ms, false),
			row("unique", "hybrid", "guard", 1000, 995, 10*ms, false),
			row("unique", "hybrid", "ceiling", 1000, 995, 10*ms, false),
			row("unique", "table", "guard", 2000, 1990, 12*ms, false),
			row("unique", "table", "ceiling", 2000, 1990, 11*ms, false),
			row("unique", "hybrid", "guard", 2000, 1990, 11*ms, false),
			row("unique", "hybrid", "ceiling", 2000, 1990, 12*ms, false),
			row("unique", "table", "guard", 4000, 2500, 900*ms, true),
			row("unique", "table", "ceiling", 4000, 2800, 800*ms, true),
			row("unique", "hybrid", "guard", 4000, 3900, 20*ms, false),
			row("unique", "hybrid", "ceiling", 4000, 3950, 19*ms, false),
			row("unique", "table", "minimal", 1000, 996, 10*ms, false),
			row("unique", "table", "minimal", 2000, 1990, 10*ms, false),
			row("unique", "table", "minimal", 4000, 3000, 700*ms, true),
			row("unique", "hybrid", "minimal", 1000, 996, 10*ms, false),
			row("unique", "hybrid", "minimal", 2000, 1990, 11*ms, false),
			row("unique", "hybrid", "minimal", 4000, 3960, 18*ms, false),
			row("storm", "table", "guard", 1000, 995, 10*ms, false),
			row("storm", "hybrid", "guard", 1000, 995, 10*ms, false),
			row("storm", "table", "guard", 2000, 1990, 40*ms, false),
			row("storm", "hybrid", "guard", 2000, 1990, 10*ms, false),
			row("storm", "table", "guard", 4000, 3990, 60*ms, false),
			row("storm", "hybrid", "guard", 4000, 3990, 11*ms, false),
		},
		// Identical runs differ by 4%, 10% and 2%: a noise of 10%.
		Repeats: []Row{
			repeat("table", "guard", 1, 10*ms), repeat("table", "ceiling", 1, 10*ms), repeat("hybrid", "guard", 1, 10*ms),
			repeat("hybrid", "guard", 2, 10200*time.Microsecond), repeat("table", "ceiling", 2, 11*ms), repeat("table", "guard", 2, 10400*time.Microsecond),
		},
	}
}

func repeat(st, impl string, run int, p99 time.Duration) Row {
	r := row("unique", st, impl, 1000, 995, p99, false)
	r.Run = run
	return r
}

func TestAnswer(t *testing.T) {
	r := sample()
	require.InDelta(t, 0.10, r.Noise().Threshold, 0.001)
	v := r.Answer()
	require.Len(t, v, 2)

	require.Equal(t, "unique", v[0].Scenario)
	require.Equal(t, 4000.0, v[0].P99From)
	require.Equal(t, 4000.0, v[0].ThroughputFrom)
	require.Equal(t, 2000.0, v[0].TableSustained)
	require.Equal(t, 4000.0, v[0].HybridSustained)
	require.Contains(t, v[0].Text(), "on p99 from 4000 req/s offered")

	require.Equal(t, 2000.0, v[1].P99From)
	require.Zero(t, v[1].ThroughputFrom)
	require.Contains(t, v[1].Text(), "not on throughput")

	// Equal figures: no winner.
	r.Rows = []Row{
		row("mix", "table", "guard", 1000, 995, 10*time.Millisecond, false),
		row("mix", "hybrid", "guard", 1000, 995, 10500*time.Microsecond, false),
	}
	v = r.Answer()
	require.Zero(t, v[0].P99From)
	require.Contains(t, v[0].Text(), "did not beat the table")

	// The hybrid's ladder stopped first: the table wins the top rate.
	r.Rows = []Row{
		row("mix", "table", "guard", 1000, 995, 20*time.Millisecond, false),
		row("mix", "hybrid", "guard", 1000, 995, 5*time.Millisecond, true),
		row("mix", "table", "guard", 2000, 1995, 20*time.Millisecond, false),
	}
	require.Zero(t, r.Answer()[0].P99From)
}

func TestNoiseFromRepeats(t *testing.T) {
	n := sample().Noise()
	require.InDelta(t, 0.10, n.Threshold, 0.001)
	require.Equal(t, 3, n.Pairs)
	require.Equal(t, "unique", n.Scenario)
	require.Equal(t, 1000.0, n.Offered)
	require.Len(t, n.Spreads, 3)
	require.Equal(t, Spread{Strategy: "table", Impl: "guard", P99s: []time.Duration{10 * time.Millisecond, 10400 * time.Microsecond}, Range: 0.04},
		Spread{Strategy: n.Spreads[0].Strategy, Impl: n.Spreads[0].Impl, P99s: n.Spreads[0].P99s, Range: math.Round(n.Spreads[0].Range*1000) / 1000})

	// The 90th percentile of the pairs, not their maximum.
	r := &Report{}
	for i, p99 := range []time.Duration{100, 101, 102, 103, 104, 105, 106, 107, 108, 200} {
		r.Repeats = append(r.Repeats, repeat("table", "guard", i+1, p99*100*time.Microsecond))
	}
	n = r.Noise()
	require.Equal(t, 45, n.Pairs)
	require.Less(t, n.Threshold, 0.99)
	require.Greater(t, n.Threshold, 0.8)

	// Identical p99s: the floor. A saturated run is left out.
	r.Repeats = []Row{repeat("table", "guard", 1, time.Millisecond), repeat("table", "guard", 2, time.Millisecond),
		repeat("table", "guard", 3, time.Second)}
	r.Repeats[2].Saturated = true
	n = r.Noise()
	require.Equal(t, 1, n.Pairs)
	require.InDelta(t, MinNoise, n.Threshold, 1e-9)

	// No repeats: not measured.
	n = (&Report{}).Noise()
	require.Zero(t, n.Pairs)
	require.InDelta(t, DefaultNoise, n.Threshold, 1e-9)
}

func TestOverheads(t *testing.T) {
	o := sample().Overheads()
	require.Len(t, o, 2) // storm has no ceiling
	require.Equal(t, "unique", o[0].Scenario)
	require.Equal(t, "table", o[0].Strategy)
	require.True(t, o[0].GuardSaturated)
	require.InDelta(t, 2500.0/2800, o[0].ThroughputRatio, 1e-9)
	require.InDelta(t, 2800.0/3000, o[0].MinimalRatio, 1e-9)
	require.True(t, o[0].MinimalSaturated)
	require.Equal(t, 2000.0, o[0].At)
	require.InDelta(t, 12.0/11, o[0].P99Ratio, 1e-9)
	require.InDelta(t, 11.0/10, o[0].MinimalP99Ratio, 1e-9)
	require.Equal(t, "hybrid", o[1].Strategy)
	require.Equal(t, 4000.0, o[1].At)
	require.False(t, o[1].GuardSaturated)
	require.InDelta(t, 19.0/18, o[1].MinimalP99Ratio, 1e-9)

	// Without a minimal ladder, its figures stay zero.
	r := sample()
	r.Rows = slices.DeleteFunc(r.Rows, func(row Row) bool { return row.Impl == "minimal" })
	o = r.Overheads()
	require.Zero(t, o[0].MinimalRatio)
	require.Zero(t, o[0].MinimalP99)
	require.Equal(t, 2000.0, o[0].At)
}

func TestRatios(t *testing.T) {
	r := sample()
	x := r.Ratios("unique")
	require.Len(t, x, 6)
	require.Equal(t, "table", x[2].Strategy)
	require.Equal(t, 4000.0, x[2].Offered)
	require.InDelta(t, 2500.0/2800, x[2].GuardCeiling, 1e-9)
	require.InDelta(t, 2800.0/3000, x[2].CeilingMinimal, 1e-9)
	require.InDelta(t, 900.0/800, x[2].P99GuardCeiling, 1e-9)
	require.InDelta(t, 800.0/700, x[2].P99CeilingMinimal, 1e-9)
	require.Equal(t, []string{"guard", "ceiling", "minimal"}, x[2].Saturated)
	require.Empty(t, x[0].Saturated)
	require.Empty(t, r.Ratios("storm")) // no ceiling
}

func TestWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	r := sample()
	r.Rows[0].Note = "first error: a, b"
	require.NoError(t, Write(dir, r))

	f, err := os.Open(filepath.Join(dir, CSVFile))
	require.NoError(t, err)
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	require.Len(t, recs, 1+len(r.Rows)+len(r.Repeats))
	require.Equal(t, csvHeader, recs[0])
	require.Equal(t, []string{"unique", "unique pattern", "0.000", "table", "guard", "1000.0", "995.0", "5.000", "7.500", "10.000"}, recs[1][:10])
	require.Equal(t, "first error: a, b", recs[1][len(recs[1])-1])
	require.Equal(t, "", recs[1][len(recs[1])-2])
	last := recs[len(recs)-1]
	require.Equal(t, []string{"unique", "table", "guard", "2"}, []string{last[0], last[3], last[4], last[len(last)-2]})

	md, err := os.ReadFile(filepath.Join(dir, MarkdownFile))
	require.NoError(t, err)
	for _, want := range []string{
		"# idem capacity report", "## The answer", "on p99 from 4000 req/s offered",
		"## Overhead: guard ÷ ceiling and ceiling ÷ minimal",
		"| unique | table | 2500* | 2800* | 3000* | 0.89 (below 0.9) | 0.93 | 2000 | 12.0ms | 11.0ms | 10.0ms | 1.09 | 1.10 |",
		"| table | 4000 | 0.89 | 0.93 | 1.12 ! | 1.14 ! | guard, ceiling, minimal |",
		"## Noise", "(3 pairs), at least 5%: **10%**", "| table | ceiling | 10.0ms, 11.0ms | 10% |",
		"## Scenario storm: storm pattern", "![p99 latency against offered load](p99.png)",
		"postgres_server_version: 15.2",
	} {
		require.Contains(t, string(md), want)
	}
	require.NotContains(t, string(md), "Interrupted")

	for _, name := range []string{P99Plot, ThroughputPlot} {
		f, err := os.Open(filepath.Join(dir, name))
		require.NoError(t, err)
		img, err := png.Decode(f)
		f.Close()
		require.NoError(t, err, name)
		require.Greater(t, img.Bounds().Dx(), 1000, name)
	}
}

func TestWriteEmptyAndInterrupted(t *testing.T) {
	r := &Report{Setup: Setup{Interrupted: true, Started: time.Unix(0, 0), Finished: time.Unix(1, 0)}}
	dir := t.TempDir()
	require.NoError(t, Write(dir, r))
	md, err := os.ReadFile(filepath.Join(dir, MarkdownFile))
	require.NoError(t, err)
	require.Contains(t, string(md), "**Interrupted**")
	require.Contains(t, string(md), "Not measured")
}

func TestLine(t *testing.T) {
	r := row("unique", "hybrid", "ceiling", 4000, 3990.4, 12345*time.Microsecond, false)
	h, l := Header(), Line(r)
	require.Equal(t, strings.Index(h, "p99.9")+len("p99.9"), strings.Index(l, ms(r.P999))+len(ms(r.P999)), "columns align:\n%s\n%s", h, l)
	require.Contains(t, l, "  ok")
	r.Saturated, r.Note = true, "achieved 10/s"
	require.Contains(t, Line(r), "SATURATED: achieved 10/s")
}
