package durable

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
)

// TestPartitionPruning: on the hash-partitioned layout, every statement on
// one key reads and writes only the partition of its scope, under both the
// custom plan and the generic plan a prepared statement switches to (whose
// other partitions are pruned when the executor starts).
func TestPartitionPruning(t *testing.T) {
	ctx := t.Context()
	const parts = 8
	s, pool := planStoreOf(t, &Config{Partitions: parts})
	_, err := pool.Exec(ctx, `
INSERT INTO `+s.table+` (user_id, key, request_hash, owner_token, created_at, hold_until, retention)
SELECT 'user-' || (g % 1000), 'key-' || g, sha256(g::text::bytea), decode(md5(g::text), 'hex'),
	now() - (g % 86000) * interval '1 second', now() - (g % 86000) * interval '1 second' + interval '46.5 seconds',
	interval '24 hours'
FROM generate_series(1, 20000) AS g`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE `+s.table)
	require.NoError(t, err)

	// The partition of user-7's rows, and one that holds none of them.
	var home string
	require.NoError(t, pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM `+s.table+` WHERE user_id = 'user-7' LIMIT 1`).Scan(&home))
	home = home[strings.LastIndex(home, ".")+1:]
	require.Regexp(t, `^"?`+table+`_p\d+"?$`, home)
	home = strings.Trim(home, `"`)

	key := []any{"user-7", "key-7"}
	checkPlans(t, pool, keyStatements(s, key, key), func(t *testing.T, name, mode string, sc scan) {
		if leaseScan(sc) {
			return
		}
		if strings.Contains(name, "many") {
			// A group commit's statement serves keys of any partition: its
			// plan lists every partition, each probed by its own primary
			// key for the keys that belong there (pruned at run time).
			require.Equal(t, sc.Relation+"_pkey", sc.Index, "%s uses index %s on %s (%s)", name, sc.Index, sc.Relation, mode)
			return
		}
		require.Equal(t, home, sc.Relation, "%s reads partition %s (%s)", name, sc.Relation, mode)
		require.Equal(t, home+"_pkey", sc.Index, "%s uses index %s (%s)", name, sc.Index, mode)
	})

	// Control: the sweeper's statement reads every partition, which shows
	// the check above can see them.
	seen := map[string]bool{}
	for _, sc := range explainScans(t, ctx, pool, "force_generic_plan", s.sql.sweepBatch, []any{s.retention, 10, time.Time{}}) {
		seen[sc.Relation] = true
	}
	require.Len(t, seen, parts)

	// The claim's insert routes the row to the same partition.
	var got string
	p := idem.ClaimParams{Scope: "user-7", Key: "new-key", Owner: idem.Token{1}}
	_, claimed, err := s.Claim(ctx, p)
	require.NoError(t, err)
	require.True(t, claimed)
	require.NoError(t, pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM `+s.table+` WHERE user_id = $1 AND key = $2`, p.Scope, p.Key).Scan(&got))
	require.True(t, strings.HasSuffix(got, home), fmt.Sprintf("%s in %s", p.Key, got))
}
