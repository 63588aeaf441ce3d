package bigtable

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Relation is the on-disk size of one relation of the table.
type Relation struct {
	Name  string // the index name, or "heap" or "TOAST"
	Kind  string // "heap", "index" or "toast"
	Def   string // the index definition (pg_get_indexdef)
	Bytes int64
}

// Sizes is the table's footprint, read from the catalog.
type Sizes struct {
	Rows       int64 // rows in the table when measured (live and expired)
	Relations  []Relation
	Total      int64 // pg_total_relation_size
	Fillfactor string
}

// BytesPerMillion is the table's total size per million rows.
func (s Sizes) BytesPerMillion() float64 {
	if s.Rows == 0 {
		return 0
	}
	return float64(s.Total) / float64(s.Rows) * 1e6
}

// leavesSQL lists the relations that hold the rows of table $1: the table
// itself, or, when it is partitioned, its partitions (a partitioned table
// has no storage and no statistics of its own).
const leavesSQL = `
SELECT relid FROM pg_partition_tree($1::regclass) WHERE isleaf
UNION ALL
SELECT $1::regclass WHERE (SELECT relkind FROM pg_class WHERE oid = $1::regclass) <> 'p'`

// readSizes reads the heap, TOAST and every index of table from the
// catalog, summed over its partitions if it has any; rows is how many rows
// the table holds.
func readSizes(ctx context.Context, pool *pgxpool.Pool, table string, rows int64) (Sizes, error) {
	s := Sizes{Rows: rows}
	var heap, toast int64
	var opts []string
	err := pool.QueryRow(ctx, `
WITH leaves AS (`+leavesSQL+`)
SELECT coalesce(sum(pg_relation_size(c.oid)), 0)::bigint,
	coalesce(sum(pg_total_relation_size(nullif(c.reltoastrelid, 0))), 0)::bigint,
	coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint,
	coalesce((SELECT reloptions FROM pg_class WHERE oid = (SELECT min(relid::oid) FROM leaves)), '{}')
FROM leaves l JOIN pg_class c ON c.oid = l.relid`, table).Scan(&heap, &toast, &s.Total, &opts)
	if err != nil {
		return s, fmt.Errorf("table size: %w", err)
	}
	s.Fillfactor = "100 (default)"
	for _, o := range opts {
		if v, ok := strings.CutPrefix(o, "fillfactor="); ok {
			s.Fillfactor = v
		}
	}
	s.Relations = append(s.Relations, Relation{Name: "heap", Kind: "heap", Bytes: heap})
	idx, err := pool.Query(ctx, `
SELECT i.relname::text, pg_get_indexdef(i.oid),
	CASE WHEN i.relkind = 'I' -- partitioned: the sum of its partitions' indexes
		THEN (SELECT coalesce(sum(pg_relation_size(relid)), 0) FROM pg_partition_tree(i.oid) WHERE isleaf)
		ELSE pg_relation_size(i.oid) END::bigint
FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
WHERE x.indrelid = $1::regclass
ORDER BY i.relname`, table)
	if err != nil {
		return s, fmt.Errorf("index sizes: %w", err)
	}
	defer idx.Close()
	for idx.Next() {
		r := Relation{Kind: "index"}
		if err := idx.Scan(&r.Name, &r.Def, &r.Bytes); err != nil {
			return s, fmt.Errorf("index sizes: %w", err)
		}
		s.Relations = append(s.Relations, r)
	}
	if err := idx.Err(); err != nil {
		return s, fmt.Errorf("index sizes: %w", err)
	}
	s.Relations = append(s.Relations, Relation{Name: "TOAST", Kind: "toast", Bytes: toast})
	return s, nil
}

// tableStats are the table's cumulative statistics.
type tableStats struct {
	Upd, HotUpd, Del, Dead, Autovacuums int64
}

// readStats flushes the pending statistics of every idle connection of pool
// (PostgreSQL 15+) and reads the table's counters.
func readStats(ctx context.Context, pool *pgxpool.Pool, table string) (tableStats, error) {
	for _, conn := range pool.AcquireAllIdle(ctx) {
		_, _ = conn.Exec(ctx, "SELECT pg_stat_force_next_flush()") // absent before 15: then the counters lag
		conn.Release()
	}
	var s tableStats
	err := pool.QueryRow(ctx, `
SELECT coalesce(sum(n_tup_upd), 0)::bigint, coalesce(sum(n_tup_hot_upd), 0)::bigint,
	coalesce(sum(n_tup_del), 0)::bigint, coalesce(sum(n_dead_tup), 0)::bigint, coalesce(sum(autovacuum_count), 0)::bigint
FROM pg_stat_user_tables WHERE relid IN (`+leavesSQL+`)`, table).Scan(&s.Upd, &s.HotUpd, &s.Del, &s.Dead, &s.Autovacuums)
	if err != nil {
		return s, fmt.Errorf("table statistics: %w", err)
	}
	return s, nil
}

// settingNames are the server settings the report shows.
var settingNames = []string{
	"server_version", "autovacuum", "autovacuum_naptime", "autovacuum_vacuum_scale_factor",
	"autovacuum_vacuum_cost_delay", "shared_buffers", "effective_cache_size", "synchronous_commit",
	"fsync", "max_wal_size", "checkpoint_timeout", "maintenance_work_mem",
}

// Setting is one server setting.
type Setting struct{ Name, Value string }

func readSettings(ctx context.Context, pool *pgxpool.Pool) ([]Setting, error) {
	out := make([]Setting, 0, len(settingNames))
	for _, n := range settingNames {
		var v string
		if err := pool.QueryRow(ctx, "SELECT current_setting($1)", n).Scan(&v); err != nil {
			return nil, fmt.Errorf("setting %s: %w", n, err)
		}
		out = append(out, Setting{n, v})
	}
	return out, nil
}
