package durable

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestBacklogPlans loads a day of keys (1% in progress, a few postponed),
// ANALYZEs them, and checks with EXPLAIN, under custom and generic plans,
// that the scan of new rows reads the created_at index over its window and
// the postponed listing reads the partial index on reconcile_after: neither
// reads the whole table.
func TestBacklogPlans(t *testing.T) {
	ctx := t.Context()
	cfg := &Config{}
	if v := os.Getenv("IDEM_TEST_PARTITIONS"); v != "" { // as internal/testdb does
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		cfg.Partitions = n
	}
	s, pool := planStoreOf(t, cfg)
	tbl := s.Table()
	_, err := pool.Exec(ctx, `
INSERT INTO `+tbl+` (user_id, key, request_hash, owner_token, created_at, hold_until, retention,
	response_status, response_headers, response_body, completed_at, reconcile_after)
SELECT 'user-' || (g % 1000), 'key-' || g, sha256(g::text::bytea), decode(md5(g::text), 'hex'),
	now() - (g % 86000) * interval '1 second', now() - (g % 86000) * interval '1 second' + interval '46.5 seconds',
	interval '24 hours',
	CASE WHEN g % 100 = 0 THEN NULL ELSE 201 END, CASE WHEN g % 100 = 0 THEN NULL ELSE '{}'::jsonb END,
	CASE WHEN g % 100 = 0 THEN NULL ELSE '\x7b7d'::bytea END,
	CASE WHEN g % 100 = 0 THEN NULL ELSE now() - (g % 86000) * interval '1 second' END,
	CASE WHEN g % 1000 = 0 THEN now() + interval '1 minute' END
FROM generate_series(1, 50000) AS g`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE `+tbl)
	require.NoError(t, err)
	from := time.Now().Add(-3 * time.Minute)
	name := strings.Trim(strings.Split(tbl, ".")[1], `"`)
	for label, st := range map[string]struct {
		sql   string
		args  []any
		index string
	}{
		// (_pN: the index of each partition, on the partitioned layout.)
		"new":       {s.backlog.listNew, []any{from, "", "", time.Now().Add(-time.Minute), 100}, name + `(_p\d+)?_created_at_idx`},
		"postponed": {s.backlog.listPostponed, []any{100}, name + `(_p\d+)?_reconcile_after_idx`},
	} {
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			t.Run(label+"/"+mode, func(t *testing.T) {
				tx, err := pool.Begin(ctx)
				require.NoError(t, err)
				defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
				_, err = tx.Exec(ctx, "SET LOCAL plan_cache_mode = "+mode)
				require.NoError(t, err)
				rs, err := tx.Query(ctx, "EXPLAIN "+st.sql, st.args...)
				require.NoError(t, err)
				lines, err := pgx.CollectRows(rs, pgx.RowTo[string])
				require.NoError(t, err)
				plan := strings.Join(lines, "\n")
				require.Regexp(t, "Index Scan using "+st.index, plan)
				require.NotContains(t, plan, "Seq Scan", plan)
			})
		}
	}
}
