package durable_test

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/idemtest"
	"github.com/idemguard/idem/internal/testdb"
)

// TestConformance runs the idem.Store conformance suite against the
// PostgreSQL store, with the default retention and with a short one.
// It runs on the hash-partitioned layout too, and with the Store inserting
// first, as it does while its claims rarely find a row (a new Store reads
// first).
func TestConformance(t *testing.T) {
	for _, c := range []struct {
		retention   time.Duration
		partitions  int
		insertFirst bool
	}{{0, 0, false}, {time.Hour, 0, false}, {0, 8, false}, {0, 0, true}, {0, 8, true}} {
		name := "retention=default"
		if c.retention != 0 {
			name = "retention=" + c.retention.String()
		}
		if c.partitions != 0 {
			name += "/partitions=" + strconv.Itoa(c.partitions)
		}
		if c.insertFirst {
			name += "/insert-first"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			idemtest.RunStoreSuite(t, pgHarness(c.retention, c.partitions, c.insertFirst))
		})
	}
}

func pgHarness(retention time.Duration, partitions int, insertFirst bool) idemtest.Harness {
	var pools sync.Map // *durable.Store -> *pgxpool.Pool
	h := idemtest.Harness{
		New: func(t *testing.T) idem.Store {
			store, pool := testdb.Store(t, &durable.Config{Retention: retention, Partitions: partitions})
			durable.PinInsertFirst(store, insertFirst)
			pools.Store(store, pool)
			return store
		},
		Age: func(t *testing.T, s idem.Store, scope, key string, by time.Duration) {
			t.Helper()
			store := s.(*durable.Store)
			pool, _ := pools.Load(store)
			tag, err := pool.(*pgxpool.Pool).Exec(t.Context(),
				`UPDATE `+store.Table()+` SET created_at = created_at - $3::bigint * interval '1 microsecond',
					completed_at = completed_at - $3::bigint * interval '1 microsecond',
					released_at = released_at - $3::bigint * interval '1 microsecond',
					hold_until = hold_until - $3::bigint * interval '1 microsecond'
				WHERE user_id = $1 AND key = $2`, scope, key, by.Microseconds())
			require.NoError(t, err)
			require.EqualValues(t, 1, tag.RowsAffected())
		},
		Sweep: func(t *testing.T, s idem.Store) (int64, error) {
			sw, err := durable.NewSweeper(s.(*durable.Store))
			if err != nil {
				return 0, err
			}
			return durable.TuneSweeper(sw, durable.SweeperTuning{BatchPause: -1}).SweepOnce(t.Context())
		},
	}
	return h
}
