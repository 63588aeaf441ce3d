package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/bench/internal/fleet"
	"github.com/idemguard/idem/bench/internal/report"
	"github.com/idemguard/idem/internal/heavy"
)

// TestMain lets the test binary serve as the bench's worker processes, as
// the bench binary does (-instances re-runs the running executable).
func TestMain(m *testing.M) {
	if fleet.IsWorker() {
		os.Exit(fleet.Serve(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func TestInstanceCounts(t *testing.T) {
	n, err := instanceCounts("")
	require.NoError(t, err)
	require.Empty(t, n)
	n, err = instanceCounts("1, 2,4")
	require.NoError(t, err)
	require.Equal(t, []int{1, 2, 4}, n)
	for _, bad := range []string{"0", "x", "2,1", "2,2", "-1"} {
		_, err := instanceCounts(bad)
		require.Error(t, err, bad)
	}
	var out, errOut bytes.Buffer
	require.Equal(t, 2, run(t.Context(), []string{"-instances", "4,2"}, &out, &errOut))
	require.Contains(t, errOut.String(), "ascending")
}

var pidsLine = regexp.MustCompile(`\(pids \[([0-9 ]+)\]\)`)

// workerPIDs returns the worker pids the run's progress lines announced.
func workerPIDs(t *testing.T, out string) []int {
	t.Helper()
	var pids []int
	for _, m := range pidsLine.FindAllStringSubmatch(out, -1) {
		for _, f := range strings.Fields(m[1]) {
			pid, err := strconv.Atoi(f)
			require.NoError(t, err)
			pids = append(pids, pid)
		}
	}
	return pids
}

// requireGone fails unless every process in pids has exited and been reaped.
func requireGone(t *testing.T, pids []int) {
	t.Helper()
	for _, pid := range pids {
		err := syscall.Kill(pid, 0)
		require.True(t, errors.Is(err, syscall.ESRCH), "worker %d survived the run (kill 0: %v)", pid, err)
	}
}

// TestInstances runs the many-instance mode for real with two workers per
// strategy: both workers answer, every intent of the storm runs once across
// the two processes, and no worker survives the run.
func TestInstances(t *testing.T) {
	heavy.Gate(t) // worker processes
	args := servers(t)
	dir := filepath.Join(t.TempDir(), "report")
	var out, errOut bytes.Buffer
	code := run(t.Context(), append(args,
		"-instances", "2", "-rates", "100", "-step", "300ms", "-drain", "5s", "-warmup", "100ms",
		"-scenarios", "unique,storm", "-work", "1ms", "-out", dir), &out, &errOut)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
	pids := workerPIDs(t, out.String())
	require.Len(t, pids, 4, "two workers per strategy:\n%s", out.String())
	requireGone(t, pids)
	require.Contains(t, out.String(), "summary")

	f, err := os.Open(filepath.Join(dir, report.InstancesCSV))
	require.NoError(t, err)
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	col := map[string]int{}
	for i, name := range recs[0] {
		col[name] = i
	}
	get := func(rec []string, name string) string {
		i, ok := col[name]
		require.True(t, ok, "no column %s", name)
		return rec[i]
	}
	num := func(rec []string, name string) int64 {
		v, err := strconv.ParseInt(get(rec, name), 10, 64)
		require.NoError(t, err, name)
		return v
	}
	seen := map[string]bool{}
	for _, rec := range recs[1:] {
		id := get(rec, "scenario") + "/" + get(rec, "strategy")
		seen[id] = true
		require.Equal(t, "2", get(rec, "instances"), id)
		require.Equal(t, "8", get(rec, "pool_per_instance"), "the pool of 16 divided among 2: %s", id)
		require.Zero(t, num(rec, "errors"), "%s: %s", id, get(rec, "note"))
		require.Zero(t, num(rec, "dropped"), id)
		per := strings.Split(get(rec, "requests_per_instance"), ";")
		require.Len(t, per, 2, id)
		var sum int64
		for _, p := range per {
			n, err := strconv.ParseInt(p, 10, 64)
			require.NoError(t, err)
			require.Positive(t, n, "%s: a worker received no request: %v", id, per)
			sum += n
		}
		require.Equal(t, num(rec, "requests"), sum, "%s: every request reached a worker", id)
		// Each intent ran exactly once across the two processes.
		require.Zero(t, num(rec, "double_executions"), id)
		require.Equal(t, num(rec, "intents"), num(rec, "handler_executions"), id)
		require.Equal(t, num(rec, "executed"), num(rec, "handler_executions"), id)
		if get(rec, "scenario") == "storm" {
			require.Greater(t, num(rec, "requests"), num(rec, "intents"), "%s: retries were sent", id)
			require.Positive(t, num(rec, "replayed")+num(rec, "in_progress"), id)
		}
	}
	require.Len(t, seen, 4, "unique and storm, table and hybrid")
	md, err := os.ReadFile(filepath.Join(dir, report.MarkdownFile))
	require.NoError(t, err)
	require.Contains(t, string(md), "## Many instances")
}

// cancelAfterInstanceRows cancels once rows step lines of the many-instance
// run have been written, the way Ctrl-C lands in the middle of a run.
type cancelAfterInstanceRows struct {
	bytes.Buffer
	rows   int
	cancel context.CancelFunc
	done   bool
}

func (w *cancelAfterInstanceRows) Write(p []byte) (int, error) {
	n, err := w.Buffer.Write(p)
	if s := w.String(); !w.done {
		if i := strings.Index(s, report.InstanceHeader()); i >= 0 && strings.Count(s[i:], "\n") > w.rows {
			w.done = true
			w.cancel()
		}
	}
	return n, err
}

// TestInstancesInterrupted: Ctrl-C in the middle of a many-instance run stops
// the workers and still writes the report.
func TestInstancesInterrupted(t *testing.T) {
	heavy.Gate(t) // worker processes
	args := servers(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a safety net only
	defer cancel()
	out := &cancelAfterInstanceRows{rows: 1, cancel: cancel}
	var errOut bytes.Buffer
	code := run(ctx, append(args, "-instances", "1,2", "-rates", "100,200,400", "-step", "300ms", "-warmup", "0",
		"-strategies", "table", "-scenarios", "unique", "-work", "1ms", "-out", dir), out, &errOut)
	require.Equal(t, 130, code, "stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
	pids := workerPIDs(t, out.String())
	require.Len(t, pids, 1, "the second fleet never started:\n%s", out.String())
	requireGone(t, pids)
	md, err := os.ReadFile(filepath.Join(dir, report.MarkdownFile))
	require.NoError(t, err)
	require.Contains(t, string(md), "**Interrupted**")
}
