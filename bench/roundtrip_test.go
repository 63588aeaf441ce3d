package main_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/bench/internal/target"
)

// TestRoundTrips pins the round trips of every path, counted on the wire
// side of the store (statements) and of the Redis client (commands). Not
// timed: these are the figures BenchmarkGuard reports as pg-roundtrips/op
// and redis-cmds/op.
func TestRoundTrips(t *testing.T) {
	want := map[string]map[string][2]int64{ // strategy -> path -> {pg, redis}
		target.Table: {
			"first_execution":                {2, 0}, // claim, complete
			"first_execution_claiming_first": {2, 0},
			"replay":                         {1, 0}, // claim returns the finished row
			"in_progress":                    {1, 0},
			"key_reused":                     {1, 0},
			"expired_key":                    {3, 0}, // claim finds the expired row, takeover, complete
			"missing_key":                    {0, 0},
		},
		target.Hybrid: {
			// The lease is taken (or read) with SET NX GET and its age read
			// with PTTL, both in one round trip; once the answer is
			// committed, a copy of it replaces the lease.
			"first_execution":                {2, 3}, // lease (2), claim, complete, copy
			"first_execution_claiming_first": {2, 1}, // claim, complete, copy
			"replay":                         {0, 2}, // the lease holds the answer's copy
			"in_progress":                    {0, 2}, // the lease says the key runs under this fingerprint
			"key_reused":                     {0, 2}, // the copy's fingerprint differs
			"expired_key":                    {3, 3}, // lease (2), claim finds the expired row, takeover, complete, copy
			"missing_key":                    {0, 0},
		},
	}
	for _, strategy := range []string{target.Table, target.Hybrid} {
		for _, p := range paths {
			t.Run(strategy+"/"+p.name, func(t *testing.T) {
				r := newRig(t, strategy)
				next := p.prepare(t, r)
				pg0, rd0 := r.pg.Count(), r.redisCount(t)
				for i := range 3 {
					_, out, _ := r.guard.Do(t.Context(), next(i), work)
					require.Equal(t, p.outcome, out)
				}
				w := want[strategy][p.name]
				require.Equal(t, 3*w[0], r.pg.Count()-pg0, "PostgreSQL round trips")
				require.Equal(t, 3*w[1], r.redisCount(t)-rd0, "Redis commands")
			})
		}
	}
}
