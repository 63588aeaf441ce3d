package bigtable

import (
	"bytes"
	"encoding/csv"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/heavy"
	"github.com/idemguard/idem/internal/testdb"
)

func TestKeyOfMatchesTheLoader(t *testing.T) {
	require.Equal(t, "user-12345", scopeOf(3_012_345))
	require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`, keyOf(liveTag, 7))
	require.False(t, answered(300))
	require.True(t, answered(301))
}

func TestParseCounts(t *testing.T) {
	n, err := parseCounts("1000000, 10M,500k")
	require.NoError(t, err)
	require.Equal(t, []int64{1_000_000, 10_000_000, 500_000}, n)
	for _, bad := range []string{"", "x", "0", "-1M"} {
		_, err := parseCounts(bad)
		require.Error(t, err, bad)
	}
}

// TestLoad checks that the loader writes the rows and shares it is asked
// for, with keys the replay can find through the store.
func TestLoad(t *testing.T) {
	pool := testdb.Pool(t)
	cfg := &durable.Config{Schema: testdb.SchemaName(t, pool), Table: TableName}
	require.NoError(t, durable.Migrate(t.Context(), pool, cfg))
	store, err := durable.New(pool, cfg)
	require.NoError(t, err)
	table := store.Table()

	const live, expired = 20_000, 1_000
	_, err = load(t.Context(), pool, table, batch{tag: liveTag, from: 0, to: live, spread: 22 * time.Hour}, 3_000, 2)
	require.NoError(t, err)
	_, err = load(t.Context(), pool, table, batch{tag: "expired1", from: 0, to: expired, age: 24*time.Hour + time.Minute, spread: time.Hour}, 3_000, 2)
	require.NoError(t, err)

	var (
		nLive, nOpen, nExpired, nUsers int64
		minBody, maxBody               int
		oldest                         time.Duration
	)
	require.NoError(t, pool.QueryRow(t.Context(), `
SELECT count(*) FILTER (WHERE created_at >= now() - interval '24 hours'),
	count(*) FILTER (WHERE created_at >= now() - interval '24 hours' AND response_status IS NULL),
	count(*) FILTER (WHERE created_at < now() - interval '24 hours'),
	count(DISTINCT user_id),
	min(octet_length(response_body)), max(octet_length(response_body)),
	extract(epoch FROM now() - min(created_at) FILTER (WHERE created_at >= now() - interval '24 hours'))::bigint * 1000000000
FROM `+table).Scan(&nLive, &nOpen, &nExpired, &nUsers, &minBody, &maxBody, &oldest))
	require.EqualValues(t, live, nLive)
	require.EqualValues(t, live/inProgressMod, nOpen, "1% in progress")
	require.EqualValues(t, expired, nExpired)
	require.EqualValues(t, live, nUsers, "user-<n %% 1e6>: all distinct below 1e6")
	require.GreaterOrEqual(t, minBody, 250)
	require.LessOrEqual(t, maxBody, 350)
	require.Greater(t, oldest, 20*time.Hour, "created_at spread over the retention")

	var badHash, badOwner int64
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FILTER (WHERE octet_length(request_hash) <> 32), count(*) FILTER (WHERE octet_length(owner_token) <> 16) FROM "+table).Scan(&badHash, &badOwner))
	require.Zero(t, badHash+badOwner)

	// The replay finds the answered rows by the keys it computes.
	rec, err := store.Get(t.Context(), scopeOf(4321), keyOf(liveTag, 4321))
	require.NoError(t, err)
	require.NotNil(t, rec.Answer)
	require.Equal(t, 201, rec.Answer.Status)
	require.Equal(t, "/payments/"+keyOf(liveTag, 4321), rec.Answer.Header.Get("Location"))
	rec, err = store.Get(t.Context(), scopeOf(4300), keyOf(liveTag, 4300))
	require.NoError(t, err)
	require.Nil(t, rec.Answer, "n %% 100 == 0 is in progress")
	_, err = store.Get(t.Context(), scopeOf(5), keyOf("expired1", 5))
	require.ErrorIs(t, err, idem.ErrNotFound, "expired rows are invisible")
}

// TestRun runs the whole bench at a tiny size and checks the report has
// every figure.
func TestRun(t *testing.T) {
	heavy.Gate(t) // loads and runs the big-table bench
	pool := testdb.Pool(t)
	schema := testdb.SchemaName(t, pool)
	var progress bytes.Buffer
	rep, err := Run(t.Context(), Config{
		DatabaseURL: testdb.URL(), Rows: []int64{10_000, 20_000}, Samples: 100, Concurrency: []int{1, 4},
		Chunk: 5_000, Phase: 1500 * time.Millisecond, Schema: schema, Command: "test", Progress: &progress,
	})
	require.NoError(t, err, progress.String())
	var exists bool
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists))
	require.False(t, exists, "the schema is dropped")

	require.Len(t, rep.Steps, 2)
	for _, s := range rep.Steps {
		require.Len(t, s.Ops, 8)
		for _, o := range s.Ops {
			require.Zero(t, o.Errors, "%s: %s", o.Op, o.FirstError)
			require.Equal(t, 100, o.Samples, o.Op)
		}
		require.EqualValues(t, s.Live/24+(s.Live%24*2/24), s.Expired) // round(live/24)
		require.Equal(t, s.Expired, s.Sweep.Deleted, "the sweeper deletes every expired row")
		require.Len(t, s.Hot, 2)
		require.EqualValues(t, 100, s.Hot[0].Upd, "one update per Complete")
	}
	require.Len(t, rep.Phases, 1)
	require.Positive(t, rep.Phases[0].Sweep.Deleted)

	dir := filepath.Join(t.TempDir(), "out")
	require.NoError(t, rep.Write(dir))
	md, err := os.ReadFile(filepath.Join(dir, MarkdownFile))
	require.NoError(t, err)
	for _, want := range []string{
		"load time", "rows/s", "VACUUM ANALYZE", "heap", "TOAST", "**total**", "bytes per million keys",
		OpClaimNew, OpComplete, OpReplayClaim, OpReplayGet, "| p50 | p99 | max |",
		"n_tup_upd", "n_tup_hot_upd", "HOT share", "batch p99", "autovacuum", "shared_buffers",
		"synchronous_commit", "fillfactor", "autovacuum seen on the table",
	} {
		require.Contains(t, string(md), want)
	}
	for _, r := range rep.Steps[0].Sizes.Relations {
		require.Contains(t, string(md), "| "+r.Name+" |", "every relation found in the catalog")
	}
	require.Contains(t, string(md), TableName+"_pkey")

	f, err := os.Open(filepath.Join(dir, CSVFile))
	require.NoError(t, err)
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	var all strings.Builder
	for _, r := range rows {
		all.WriteString(strings.Join(r, ",") + "\n")
	}
	for _, want := range []string{",p99,", ",bytes per million keys,", ",HOT share,", "load time", ",TOAST,", "sweep batch", "phase autovacuum="} {
		require.Contains(t, all.String(), want)
	}
}

// TestRunPartitioned runs the bench on the hash-partitioned layout: the
// sizes and the statistics are those of the partitions, summed, so they are
// not zero (a partitioned table has no storage or counters of its own).
func TestRunPartitioned(t *testing.T) {
	heavy.Gate(t) // loads and runs the big-table bench
	pool := testdb.Pool(t)
	var progress bytes.Buffer
	rep, err := Run(t.Context(), Config{
		DatabaseURL: testdb.URL(), Rows: []int64{10_000}, Samples: 100, Concurrency: []int{2},
		Chunk: 5_000, Phase: 1500 * time.Millisecond, Schema: testdb.SchemaName(t, pool),
		Partitions: 4, Command: "test", Progress: &progress,
	})
	require.NoError(t, err, progress.String())
	require.Equal(t, 4, rep.Partitions)
	s := rep.Steps[0]
	require.Equal(t, "93", s.Sizes.Fillfactor, "read from a partition")
	for _, r := range s.Sizes.Relations {
		if r.Kind != "toast" && !strings.Contains(r.Name, "reconcile_after") {
			require.Positive(t, r.Bytes, r.Name)
		}
	}
	require.EqualValues(t, 100, s.Hot[0].Upd, "one update per Complete, summed over the partitions")
	require.Equal(t, s.Expired, s.Sweep.Deleted)

	dir := filepath.Join(t.TempDir(), "out")
	require.NoError(t, rep.Write(dir))
	md, err := os.ReadFile(filepath.Join(dir, MarkdownFile))
	require.NoError(t, err)
	require.Contains(t, string(md), "into 4 partitions")
}
