package durable_test

import (
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
func TestConformance(t *testing.T) {
	for _, retention := range []time.Duration{0, time.Hour} {
		name := "retention=default"
		if retention != 0 {
			name = "retention=" + retention.String()
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			idemtest.RunStoreSuite(t, pgHarness(retention))
		})
	}
}

func pgHarness(retention time.Duration) idemtest.Harness {
	var pools sync.Map // *durable.Store -> *pgxpool.Pool
	h := idemtest.Harness{
		New: func(t *testing.T) idem.Store {
			store, pool := testdb.Store(t, &durable.Config{Retention: retention})
			pools.Store(store, pool)
			return store
		},
		Age: func(t *testing.T, s idem.Store, scope, key string, by time.Duration) {
			t.Helper()
			store := s.(*durable.Store)
			pool, _ := pools.Load(store)
			tag, err := pool.(*pgxpool.Pool).Exec(t.Context(),
				`UPDATE `+store.Table()+` SET created_at = created_at - $3::bigint * interval '1 microsecond'
				WHERE user_id = $1 AND key = $2`, scope, key, by.Microseconds())
			require.NoError(t, err)
			require.EqualValues(t, 1, tag.RowsAffected())
		},
		Retention: retention,
		Sweep: func(t *testing.T, s idem.Store) (int64, error) {
			return s.(*durable.Store).Sweep(t.Context())
		},
	}
	return h
}
