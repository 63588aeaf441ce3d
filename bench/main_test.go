package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/bench/internal/delayproxy"
	"github.com/idemguard/idem/bench/internal/fleet"
	"github.com/idemguard/idem/internal/heavy"
	"github.com/idemguard/idem/internal/testdb"
	"github.com/idemguard/idem/internal/testredis"
)

// TestMain lets the test binary serve as the bench's child processes, as the
// bench binary does: bench http re-runs the running executable as its
// workers, and both commands as their delay proxy.
func TestMain(m *testing.M) {
	if fleet.IsWorker() {
		os.Exit(fleet.Serve(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "delayproxy" {
		os.Exit(delayproxy.Command(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func TestUsage(t *testing.T) {
	var out, errOut bytes.Buffer
	require.Equal(t, 2, run(t.Context(), nil, &out, &errOut))
	require.Contains(t, errOut.String(), "crossover")
	require.Equal(t, 2, run(t.Context(), []string{"ladder"}, &out, &errOut))
	require.Contains(t, errOut.String(), `unknown command "ladder"`)
	require.Equal(t, 0, run(t.Context(), []string{"-h"}, &out, &errOut))
	require.Contains(t, out.String(), "http")
	for _, cmd := range []string{"crossover", "http"} {
		errOut.Reset()
		require.Equal(t, 0, run(t.Context(), []string{cmd, "-h"}, &out, &errOut), cmd)
		require.Contains(t, errOut.String(), "-database-url", cmd)
		require.Equal(t, 2, run(t.Context(), []string{cmd, "-nope"}, &out, &errOut), cmd)
	}
}

// servers skips the test without PostgreSQL and Redis (fails it under CI=true).
func servers(t *testing.T) []string {
	t.Helper()
	testdb.Pool(t)
	testredis.Client(t)
	return []string{"-database-url", testdb.URL(), "-redis-addr", testredis.Addr()}
}

// readCSV returns the rows of a report's CSV file, each as a map from the
// header's names.
func readCSV(t *testing.T, path string) []map[string]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	require.NotEmpty(t, recs)
	var rows []map[string]string
	for _, rec := range recs[1:] {
		row := map[string]string{}
		for i, name := range recs[0] {
			row[name] = rec[i]
		}
		rows = append(rows, row)
	}
	return rows
}

func atoi(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	require.NoError(t, err)
	return n
}

func requireFiles(t *testing.T, dir string, names ...string) {
	t.Helper()
	for _, name := range names {
		st, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		require.Positive(t, st.Size(), name)
	}
}

// TestCrossoverSmoke runs bench crossover for a few seconds against the
// servers, over loopback and through the delay proxy: every request is
// answered with one of the guard's decisions, never a reused key (a retry
// sends its intent's body), and the report holds the verdicts, the 1-caller
// row and every run.
func TestCrossoverSmoke(t *testing.T) {
	args := servers(t)
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	code := run(t.Context(), append([]string{"crossover"}, append(args, "-shares", "0,0.5", "-distances", "0,500us",
		"-rounds", "1", "-run", "300ms", "-callers", "4", "-work", "1ms", "-settle", "50", "-out", dir)...), &out, &errOut)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
	for _, want := range []string{"verdict: over loopback: ", "verdict: at +500µs round trip: ", "first executions' p50 at 1 caller"} {
		require.Contains(t, out.String(), want)
	}
	requireFiles(t, dir, "report.md", "crossover.csv", "crossover.png")
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
	require.Contains(t, string(md), "## Verdict")
	require.Contains(t, string(md), "| first execution p50, 1 caller | table ")
	require.Contains(t, string(md), "postgres_synchronous_commit=", "the server settings behind the figures")
	require.Contains(t, string(md), "each after 50 requests of its share that are not measured")

	rows := readCSV(t, filepath.Join(dir, "crossover.csv"))
	require.Len(t, rows, 2*3*2, "2 distances x (2 shares and the 1-caller run) x 2 strategies")
	for _, r := range rows {
		requests := atoi(t, r["requests"])
		require.Positive(t, requests, r)
		require.Zero(t, atoi(t, r["errors"]), r)
		require.Zero(t, atoi(t, r["key_reused"]), r)
		require.Equal(t, requests, atoi(t, r["executed"])+atoi(t, r["replayed"])+atoi(t, r["in_progress"]), r)
		require.Positive(t, atoi(t, r["p50_us"]), r)
		require.GreaterOrEqual(t, atoi(t, r["p99_us"]), atoi(t, r["p50_us"]), r)
		if r["retry_share"] == "0.00" {
			require.Equal(t, requests, atoi(t, r["executed"]), "new keys only: %v", r)
		}
		if r["distance_us"] != "0" {
			require.GreaterOrEqual(t, atoi(t, r["measured_rtt_us"]), int64(500), "through the proxy: %v", r)
		}
	}
}

// TestHTTPSmoke runs bench http for a few seconds against the servers: each
// implementation in its worker process answers every request, first
// executions as executed and replays (and retries) as replayed, and the
// report compares them.
func TestHTTPSmoke(t *testing.T) {
	heavy.Gate(t) // worker processes
	args := servers(t)
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	code := run(t.Context(), append([]string{"http"}, append(args, "-strategies", "hybrid", "-callers", "2",
		"-rounds", "2", "-run", "200ms", "-replay-keys", "20", "-settle", "50", "-out", dir)...), &out, &errOut)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
	requireFiles(t, dir, "report.md", "runs.csv")
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
	for _, want := range []string{"| hybrid | unique | 2 |", "| hybrid | replay | 2 |", "| hybrid | retries | 2 |", "guard ÷ minimal", "guard ÷ guard-unshared",
		"guard ÷ guard-async", "Disk flushes per first execution", "CPU per request", "each run after 50 requests of its scenario",
		"Errors over all runs: 0."} {
		require.Contains(t, string(md), want)
	}
	rows := readCSV(t, filepath.Join(dir, "runs.csv"))
	require.Len(t, rows, 2*3*4, "2 rounds x 3 scenarios x 4 implementations")
	impls := map[string]bool{}
	for _, r := range rows {
		impls[r["impl"]] = true
		requests := atoi(t, r["requests"])
		require.Positive(t, requests, r)
		require.Zero(t, atoi(t, r["errors"]), r)
		switch executed := atoi(t, r["executed"]); r["scenario"] {
		case "unique":
			require.Equal(t, requests, executed, r)
		case "retries": // 4 in 5 replayed, from the first answer on
			require.Positive(t, executed, r)
			require.Less(t, executed, requests, r)
		default:
			require.Zero(t, executed, r)
		}
	}
	require.Len(t, impls, 4)
}
