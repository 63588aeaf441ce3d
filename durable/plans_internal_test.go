package durable

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/internal/heavy"
)

// planRows is how many rows TestPlansUseThePrimaryKey loads besides its
// twenty thousand: $IDEM_PLAN_ROWS, or a million (a heavy test's: see
// internal/heavy).
func planRows(t *testing.T) int {
	if v := os.Getenv("IDEM_PLAN_ROWS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		return n
	}
	return 1_000_000
}

// TestPlansUseThePrimaryKey loads a table as a busy day leaves it (twenty
// thousand, then a million keys claimed in progress, 99% of them answered since, with no vacuum in
// between, so their old versions are dead), ANALYZEs it, and checks with EXPLAIN
// that every statement on one key reaches its row through the primary key,
// with both the custom plan and the generic plan a prepared statement
// switches to after five executions. A statement that matched the partial
// index of in-progress rows instead scanned tens of thousands of its entries
// per call on such a table.
func TestPlansUseThePrimaryKey(t *testing.T) {
	for i, n := range []int{20_000, planRows(t)} {
		t.Run(fmt.Sprintf("rows=%d", n), func(t *testing.T) {
			if i > 0 {
				heavy.Gate(t)
			}
			testPlans(t, n)
		})
	}
}

func testPlans(t *testing.T, n int) {
	ctx := t.Context()
	s, pool := planStore(t)
	var err error

	start := time.Now()
	// Every key is claimed in progress, then 98% get their answer: as in
	// production, the partial index of in-progress rows received an entry
	// for every row, and the answered rows left dead versions behind.
	_, err = pool.Exec(ctx, `
INSERT INTO `+s.table+` (user_id, key, request_hash, owner_token, created_at, hold_until, retention)
SELECT 'user-' || (g % 10000), 'key-' || g, sha256(g::text::bytea), decode(md5(g::text), 'hex'),
	now() - (g % 86000) * interval '1 second', now() - (g % 86000) * interval '1 second' + interval '46.5 seconds',
	interval '24 hours'
FROM generate_series(1, $1::int) AS g`, n)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `
UPDATE `+s.table+` SET response_status = 201, response_headers = '{"Location":["/orders/1"]}',
	response_body = '\x7b7d', completed_at = created_at + interval '1 second'
WHERE key NOT LIKE '%00'`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE `+s.table)
	require.NoError(t, err)
	t.Logf("loaded and analysed %d rows in %v", n, time.Since(start).Round(time.Millisecond))

	// A key in progress, one finished.
	checkPlans(t, pool, keyStatements(s, []any{"user-100", "key-100"}, []any{"user-1", "key-1"}), onThePrimaryKey)
}

// onThePrimaryKey fails t unless sc reads the table through its primary
// key (or is the lease table's read).
func onThePrimaryKey(t *testing.T, name, mode string, sc scan) {
	if leaseScan(sc) {
		return
	}
	// An index-only scan is the insert's NOT EXISTS, which needs no
	// column but the key's.
	require.Contains(t, []string{"Index Scan", "Index Only Scan"}, sc.NodeType, "%s reads the table with %s on %s (%s)", name, sc.NodeType, sc.Index, mode)
	require.Equal(t, table+"_pkey", sc.Index, "%s uses index %s (%s)", name, sc.Index, mode)
}

// TestPlansOnANewTable checks the same on a table just created and never
// analyzed, as a first deploy has it, or any table while autovacuum is off:
// the plan a prepared statement keeps after its fifth execution stays while
// the table grows, so a plan that reads the table whole because it is small
// would read it whole on every claim later (the shared insert did: a hash
// anti-join over a sequential scan).
func TestPlansOnANewTable(t *testing.T) {
	s, pool := planStore(t)
	checkPlans(t, pool, keyStatements(s, []any{"user-100", "key-100"}, []any{"user-1", "key-1"}), onThePrimaryKey)
}

// leaseScan reports whether sc reads the lease table (a fenced write's
// fence): a row per job, which any plan reads at once.
func leaseScan(sc scan) bool {
	return sc.Relation == table+"_leases"
}

// checkPlans explains each statement under the custom and the generic plan,
// in a subtest each, and calls check on every node that reads a relation.
func checkPlans(t *testing.T, pool *pgxpool.Pool, statements map[string]keyStatement, check func(t *testing.T, name, mode string, sc scan)) {
	for name, st := range statements {
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			t.Run(name+"/"+mode, func(t *testing.T) {
				scans := explainScans(t, t.Context(), pool, mode, st.sql, st.args)
				require.NotEmpty(t, scans, "no scan of the table")
				for _, sc := range scans {
					check(t, name, mode, sc)
				}
			})
		}
	}
}

// TestAnswerWritesAreHOT claims and answers keys the way requests do, one
// answer right after its claim, and reads the table's statistics: every
// answer write must be a HOT update (heap-only tuple: the new version on the
// same page, no index entry written). An index that read response_status,
// such as a partial index of in-progress rows, would make every answer write
// insert an entry into every index.
func TestAnswerWritesAreHOT(t *testing.T) {
	ctx := t.Context()
	s0, pool := planStore(t)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	s, err := New(conn.Conn(), &Config{Schema: strings.Trim(strings.Split(s0.table, ".")[0], `"`)})
	require.NoError(t, err)

	const n = 2000
	body := []byte(strings.Repeat("x", 300)) // an order as JSON
	for i := range n {
		p := idem.ClaimParams{Scope: "user-" + strconv.Itoa(i%50), Key: "key-" + strconv.Itoa(i)}
		_, err := rand.Read(p.Owner[:])
		require.NoError(t, err)
		_, claimed, err := s.Claim(ctx, p)
		require.NoError(t, err)
		require.True(t, claimed)
		require.NoError(t, s.Complete(ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 201,
			Header: map[string][]string{"Location": {"/orders/" + strconv.Itoa(i)}}, Body: body}))
	}

	// Statistics reach the shared counters when the backend goes idle;
	// force it, and poll until the updates are all counted.
	_, err = conn.Exec(ctx, "SELECT pg_stat_force_next_flush()")
	require.NoError(t, err)
	var upd, hot int64
	deadline := time.Now().Add(10 * time.Second)
	for {
		require.NoError(t, conn.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = $1::regclass`,
			s.table).Scan(&upd, &hot))
		if upd >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.EqualValues(t, n, upd, "answer writes counted")
	require.EqualValues(t, n, hot, "HOT answer writes of %d", upd)
}

// keyStatement is a statement of a Store with arguments of the right types.
type keyStatement struct {
	sql  string
	args []any
}

// keyStatements returns every statement of s on one key, by name: the writes
// and the claim on the key inProgress, the reads on finished (each a scope
// and a key).
func keyStatements(s *Store, inProgress, finished []any) map[string]keyStatement {
	owner := make([]byte, 16)
	hash := make([]byte, 32)
	with := func(key []any, more ...any) []any { return append(append([]any{}, key...), more...) }
	scopes := []string{inProgress[0].(string), finished[0].(string)}
	keys := []string{inProgress[1].(string), finished[1].(string)}
	owners := [][]byte{owner, owner}
	answers := []any{scopes, keys, owners, []int16{201, 201}, []string{`{}`, `{}`}, [][]byte{{}, {}}, s.retention}
	return map[string]keyStatement{
		"claim":           {s.sql.claim, with(inProgress, hash, owner, s.retention, owner, int64(46_500_000))},
		"insert":          {s.sql.insert, with(inProgress, hash, owner, s.retention, owner, int64(46_500_000))},
		"takeover":        {s.sql.takeover, with(inProgress, hash, owner, s.retention, owner, int64(46_500_000))},
		"get":             {s.sql.get, finished},
		"inspect":         {s.sql.inspect, finished},
		"complete":        {s.sql.complete, with(inProgress, owner, int16(201), []byte(`{}`), []byte(`{}`), s.retention)},
		"complete+notify": {s.sql.completeNotify, with(inProgress, owner, int16(201), []byte(`{}`), []byte(`{}`), s.retention, "c", "t")},
		"complete async":  {s.sql.completeAsync, with(inProgress, owner, int16(201), []byte(`{}`), []byte(`{}`), s.retention)},
		"release":         {s.sql.release, with(inProgress, owner, s.retention)},
		"release+notify":  {s.sql.releaseNotify, with(inProgress, owner, s.retention, "c", "t")},
		// The reconciler's, under its lease (the lease table aside, see
		// leaseScan).
		"complete fenced":        {s.sql.completeFenced, with(inProgress, owner, int16(201), []byte(`{}`), []byte(`{}`), s.retention, "reconcile", "h")},
		"complete fenced+notify": {s.sql.completeFencedNotify, with(inProgress, owner, int16(201), []byte(`{}`), []byte(`{}`), s.retention, "reconcile", "h", "c", "t")},
		"release fenced":         {s.sql.releaseFenced, with(inProgress, owner, s.retention, "reconcile", "h")},
		"release fenced+notify":  {s.sql.releaseFencedNotify, with(inProgress, owner, s.retention, "reconcile", "h", "c", "t")},
		// The group commit's statements, over the key and one other.
		"claim many": {s.sql.claimMany, []any{scopes, keys, [][]byte{hash, hash}, owners, s.retention, owners,
			[]int64{46_500_000, 46_500_000}}},
		"insert many": {s.sql.insertMany, []any{scopes, keys, [][]byte{hash, hash}, owners, s.retention, owners,
			[]int64{46_500_000, 46_500_000}}},
		"complete many":        {s.sql.completeMany, answers},
		"complete many async":  {s.sql.completeManyAsync, answers},
		"complete many+notify": {s.sql.completeManyNotify, append(append([]any{}, answers...), "c", []string{"t", "u"})},
	}
}

// planStore migrates a schema of its own, dropped at cleanup, and returns
// its store and the pool.
func planStore(t *testing.T) (*Store, *pgxpool.Pool) {
	t.Helper()
	return planStoreOf(t, &Config{})
}

// planStoreOf is planStore with cfg's fields (its Schema is replaced).
func planStoreOf(t *testing.T, cfg *Config) (*Store, *pgxpool.Pool) {
	t.Helper()
	pool := planPool(t)
	cfg.Schema = "idemplan_" + strings.ToLower(rand.Text()[:12])
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+cfg.Schema+" CASCADE")
	})
	require.NoError(t, Migrate(t.Context(), pool, cfg))
	s, err := New(pool, cfg)
	require.NoError(t, err)
	return s, pool
}

// planPool connects to $TEST_DATABASE_URL (internal/testdb's default
// otherwise, which this package's internal tests cannot import): the test
// fails under CI=true without PostgreSQL, and is skipped otherwise.
func planPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err == nil {
		if err = pool.Ping(ctx); err != nil {
			pool.Close()
		}
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL unreachable: %v", err)
		}
		t.Skipf("PostgreSQL unreachable: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// scan is a plan node that reads the idempotency table.
type scan struct {
	NodeType string
	Relation string
	Index    string
}

// explainScans returns the nodes of the statement's plan that read a
// relation, planned under plan_cache_mode = mode as a prepared statement with
// args, in a transaction that is rolled back.
func explainScans(t *testing.T, ctx context.Context, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, mode, sql string, args []any) []scan {
	t.Helper()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	_, err = tx.Exec(ctx, "SET LOCAL plan_cache_mode = "+mode)
	require.NoError(t, err)
	var raw []byte
	require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&raw))
	var plans []struct {
		Plan map[string]any `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(raw, &plans))
	var out []scan
	var walk func(node map[string]any)
	walk = func(node map[string]any) {
		typ, _ := node["Node Type"].(string)
		if rel, ok := node["Relation Name"].(string); ok && rel != "" && typ != "ModifyTable" {
			idx, _ := node["Index Name"].(string)
			out = append(out, scan{NodeType: typ, Relation: rel, Index: idx})
		}
		children, _ := node["Plans"].([]any)
		for _, c := range children {
			if m, ok := c.(map[string]any); ok {
				walk(m)
			}
		}
	}
	for _, p := range plans {
		walk(p.Plan)
	}
	return out
}
