package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/bench/internal/report"
	"github.com/idemguard/idem/internal/testdb"
	"github.com/idemguard/idem/internal/testredis"
)

func TestOfferedRates(t *testing.T) {
	r, err := offeredRates("", 500, 2, 8000)
	require.NoError(t, err)
	require.Equal(t, []float64{500, 1000, 2000, 4000, 8000}, r)
	r, err = offeredRates("", 1000, 1.5, 3000)
	require.NoError(t, err)
	require.Equal(t, []float64{1000, 1500, 2250}, r)
	r, err = offeredRates("100, 250,1e3", 0, 0, 0)
	require.NoError(t, err)
	require.Equal(t, []float64{100, 250, 1000}, r)
	for _, bad := range []string{"x", "0", "-5", "200,100", "100,100"} {
		_, err := offeredRates(bad, 0, 0, 0)
		require.Error(t, err, bad)
	}
	_, err = offeredRates("", 500, 1, 8000)
	require.Error(t, err)
}

func TestFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	require.Equal(t, 2, run(t.Context(), []string{"-nope"}, &out, &errOut))
	require.Equal(t, 2, run(t.Context(), []string{"-rates", "2,1"}, &out, &errOut))
	require.Contains(t, errOut.String(), "ascending")
	errOut.Reset()
	require.Equal(t, 0, run(t.Context(), []string{"-h"}, &out, &errOut))
	require.Contains(t, errOut.String(), "-max-inflight")
}

// servers skips the test without PostgreSQL and Redis (fails it under CI=true).
func servers(t *testing.T) []string {
	t.Helper()
	testdb.Pool(t)
	testredis.Client(t)
	return []string{"-database-url", testdb.URL(), "-redis-addr", testredis.Addr()}
}

// TestSmoke runs the real tool for a couple of seconds against the servers.
func TestSmoke(t *testing.T) {
	args := servers(t)
	dir := filepath.Join(t.TempDir(), "report")
	var out, errOut bytes.Buffer
	code := run(t.Context(), append(args,
		"-step", "200ms", "-drain", "5s", "-warmup", "0", "-rates", "100,200",
		"-scenarios", "unique,storm", "-work", "1ms", "-noise-runs", "2", "-out", dir), &out, &errOut)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())

	for _, want := range []string{"scenario strategy", "unique   table    guard", "storm    hybrid   ceiling",
		"storm    hybrid   minimal", "repeat 2: ", "summary", "noise: ", "answer: unique"} {
		require.Contains(t, out.String(), want)
	}
	f, err := os.Open(filepath.Join(dir, "results.csv"))
	require.NoError(t, err)
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	// 2 scenarios x 2 strategies x {guard, ceiling, minimal} at the first
	// rate at least (a loaded CI machine may saturate at the second), and 2
	// repeats of the 6 targets.
	require.GreaterOrEqual(t, len(recs)-1, 12+12)
	repeats := 0
	for _, rec := range recs[1:] {
		if rec[len(rec)-2] != "" {
			repeats++
		}
		require.NotEqual(t, "0.0", rec[6], "achieved: %v", rec)
		if rec[0] == "unique" && rec[3] == "table" {
			// Claim and complete: at most 2 statements, fewer when the
			// store's group commit shares them between concurrent requests,
			// which a loaded machine makes more likely.
			n, err := strconv.ParseFloat(rec[21], 64)
			require.NoError(t, err, "statements per first execution: %v", rec)
			require.True(t, n > 0 && n <= 2, "statements per first execution: %v", rec)
		}
	}
	require.Equal(t, 12, repeats)
	for _, name := range []string{"report.md", "p99.png", "throughput.png"} {
		st, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		require.Positive(t, st.Size())
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
	for _, setting := range []string{"postgres_autovacuum", "postgres_synchronous_commit", "postgres_fsync", "postgres_shared_buffers"} {
		require.Contains(t, string(md), "- "+setting+": ", "the server settings behind the figures")
	}
}

// cancelAfterRows is run's stdout: it cancels once rows step lines have been
// written after the header, the way Ctrl-C lands in the middle of a run.
type cancelAfterRows struct {
	bytes.Buffer
	rows   int
	cancel context.CancelFunc
	done   bool
}

func (w *cancelAfterRows) Write(p []byte) (int, error) {
	n, err := w.Buffer.Write(p)
	if s := w.String(); !w.done {
		if i := strings.Index(s, report.Header()); i >= 0 && strings.Count(s[i:], "\n") > w.rows {
			w.done = true
			w.cancel()
		}
	}
	return n, err
}

// TestInterrupted: Ctrl-C (a cancelled context) in the middle of a run still
// writes the report of what ran. The context is cancelled once the first
// step has been reported, not after a fixed time, so that a slow machine
// (setup alone can take a second under load) cannot cancel before anything
// ran.
func TestInterrupted(t *testing.T) {
	args := servers(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute) // a safety net only
	defer cancel()
	out := &cancelAfterRows{rows: 1, cancel: cancel}
	var errOut bytes.Buffer
	code := run(ctx, append(args, "-step", "400ms", "-warmup", "0", "-rates", "100,200,400,800",
		"-strategies", "table", "-scenarios", "unique", "-out", dir), out, &errOut)
	require.Equal(t, 130, code, "stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
	require.Contains(t, out.String(), "INTERRUPTED")
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
	require.True(t, strings.Contains(string(md), "**Interrupted**"))
}
