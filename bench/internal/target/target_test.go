package target

import (
	"context"
	"crypto/sha256"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/internal/testdb"
	"github.com/idemguard/idem/internal/testredis"
)

func TestCommandCalls(t *testing.T) {
	info := "# Commandstats\r\ncmdstat_set:calls=576,usec=1449,usec_per_call=2.52,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=9,usec=271,usec_per_call=30\r\ncmdstat_evalsha:calls=202,usec=5685,usec_per_call=28.14\r\n"
	require.EqualValues(t, 778, commandCalls(info))
	require.Zero(t, commandCalls(""))
}

func open(t *testing.T) *Env {
	t.Helper()
	testdb.Pool(t) // skips (fails under CI=true) without the servers
	testredis.Client(t)
	env, err := Open(t.Context(), Config{DatabaseURL: testdb.URL(), RedisAddr: testredis.Addr(), PoolSize: 4})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, env.Close(context.Background())) })
	return env
}

// TestTargetsAgree checks that the ceiling takes the guard's decisions with
// the guard's statements: same outcomes, same statements, same tuple writes
// and the same Redis commands per path.
func TestTargetsAgree(t *testing.T) {
	env := open(t)
	ctx := t.Context()
	type cost struct {
		outcome                     string
		statements, writes, rclient int64
	}
	for _, strategy := range []string{Table, Hybrid} {
		var got [2][]cost
		for i, impl := range []string{Guard, Ceiling} {
			tg, err := New(env, strategy, impl, 0)
			require.NoError(t, err)
			// Warm up: connections dialled, scripts loaded.
			_, err = tg.Do(ctx, idem.Request{Scope: "user-1", Key: "warm-" + strategy, Fingerprint: sha256.Sum256(nil)})
			require.NoError(t, err)
			req := idem.Request{Scope: "user-1", Key: "k-" + strategy, Fingerprint: sha256.Sum256([]byte(strategy))}
			reused := req
			reused.Fingerprint[0] ^= 1
			for _, r := range []idem.Request{req, req, reused} {
				before, err := env.Snapshot(ctx, tg.Table())
				require.NoError(t, err)
				out, err := tg.Do(ctx, r)
				require.NoError(t, err)
				after, err := env.Snapshot(ctx, tg.Table())
				require.NoError(t, err)
				d, err := env.Since(ctx, before, after)
				require.NoError(t, err)
				got[i] = append(got[i], cost{out, d.PGStatements, d.TupleWrites, d.RedisClient})
			}
		}
		require.Equal(t, got[0], got[1], strategy)
		require.Equal(t, []string{"executed", "replayed", "key_reused"},
			[]string{got[0][0].outcome, got[0][1].outcome, got[0][2].outcome})
		if strategy == Table {
			require.Equal(t, cost{"executed", 2, 2, 0}, got[0][0]) // claim (insert) + complete (update)
		} else {
			// The lease (SET NX GET and PTTL), the same claim and
			// complete, the answer's copy; the replay and the reused key
			// from the lease.
			require.Equal(t, []cost{{"executed", 2, 2, 3}, {"replayed", 0, 0, 2}, {"key_reused", 0, 0, 2}}, got[0])
		}
		require.True(t, env.StatsFlushable())
	}
	_, err := New(env, "nope", Guard, 0)
	require.Error(t, err)
	_, err = New(env, Table, "nope", 0)
	require.Error(t, err)
}
