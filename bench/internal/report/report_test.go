package report

import (
	"encoding/csv"
	"image/png"
	"os"
	"path/filepath"
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
			row("storm", "table", "guard", 1000, 995, 10*ms, false),
			row("storm", "hybrid", "guard", 1000, 995, 10*ms, false),
			row("storm", "table", "guard", 2000, 1990, 40*ms, false),
			row("storm", "hybrid", "guard", 2000, 1990, 10*ms, false),
			row("storm", "table", "guard", 4000, 3990, 60*ms, false),
			row("storm", "hybrid", "guard", 4000, 3990, 11*ms, false),
		},
	}
}

func TestAnswer(t *testing.T) {
	r := sample()
	require.InDelta(t, 0.10, r.Noise(), 0.001)
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

func TestNoiseFromGuardAgainstCeiling(t *testing.T) {
	ms := time.Millisecond
	r := &Report{}
	for i, ratio := range []float64{1, 1.1, 1.5, 2, 1.2} {
		rate := float64(1000 * (i + 1))
		r.Rows = append(r.Rows,
			row("unique", "table", "guard", rate, rate, time.Duration(ratio*float64(10*ms)), false),
			row("unique", "table", "ceiling", rate, rate, 10*ms, false))
	}
	require.InDelta(t, 0.5, r.Noise(), 0.001)
	require.InDelta(t, 0.25, (&Report{}).Noise(), 0.001)
}

func TestOverheads(t *testing.T) {
	o := sample().Overheads()
	require.Len(t, o, 2) // storm has no ceiling
	require.Equal(t, "unique", o[0].Scenario)
	require.Equal(t, "table", o[0].Strategy)
	require.True(t, o[0].GuardSaturated)
	require.InDelta(t, 2500.0/2800, o[0].ThroughputRatio, 1e-9)
	require.Equal(t, 2000.0, o[0].At)
	require.InDelta(t, 12.0/11, o[0].P99Ratio, 1e-9)
	require.Equal(t, "hybrid", o[1].Strategy)
	require.Equal(t, 4000.0, o[1].At)
	require.False(t, o[1].GuardSaturated)
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
	require.Len(t, recs, 1+len(r.Rows))
	require.Equal(t, csvHeader, recs[0])
	require.Equal(t, []string{"unique", "unique pattern", "0.000", "table", "guard", "1000.0", "995.0", "5.000", "7.500", "10.000"}, recs[1][:10])
	require.Equal(t, "first error: a, b", recs[1][len(recs[1])-1])

	md, err := os.ReadFile(filepath.Join(dir, MarkdownFile))
	require.NoError(t, err)
	for _, want := range []string{
		"# idem capacity report", "## The answer", "on p99 from 4000 req/s offered",
		"## Guard overhead against its ceiling", "| unique | table | 2500* | 2800* | 0.89 | 2000 |",
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
