package target

import (
	"context"
	"crypto/sha256"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/internal/testdb"
	"github.com/idemguard/idem/internal/testredis"
	"github.com/idemguard/idem/lock"
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

// settle sends what tg's Locker has queued without waiting (the answer's
// copy rides with the next exchange) by a DEL of a key nobody uses through
// that Locker, and returns the commands it sent itself, for the caller to
// discount: after it, a request's Redis commands are all counted.
func settle(t *testing.T, tg Target) int64 {
	t.Helper()
	var l *lock.Locker
	switch x := tg.(type) {
	case *guardTarget:
		l = x.locker
	case *ceiling:
		l = x.locker
	}
	if l == nil {
		return 0
	}
	require.NoError(t, l.Delete(t.Context(), "sync", "sync"))
	return 1
}

// TestTargetsAgree checks that the ceiling takes the guard's decisions with
// the guard's statements: same outcomes, same statements and tuple writes per
// path, and the same Redis commands over the paths.
func TestTargetsAgree(t *testing.T) {
	env := open(t)
	ctx := t.Context()
	type cost struct {
		outcome            string
		statements, writes int64
	}
	for _, strategy := range []string{Table, Hybrid} {
		var got [2][]cost
		var redis [2]int64
		for i, impl := range []string{Guard, Ceiling} {
			tg, err := New(env, strategy, impl, 0)
			require.NoError(t, err)
			// Warm up: connections dialled, scripts loaded; the replay
			// goes after the first request's copy.
			warm := idem.Request{Scope: "user-1", Key: "warm-" + strategy, Fingerprint: sha256.Sum256(nil)}
			for range 2 {
				_, err = tg.Do(ctx, warm)
				require.NoError(t, err)
			}
			req := idem.Request{Scope: "user-1", Key: "k-" + strategy, Fingerprint: sha256.Sum256([]byte(strategy))}
			reused := req
			reused.Fingerprint[0] ^= 1
			for _, r := range []idem.Request{req, req, reused} {
				before, err := env.Snapshot(ctx, tg.Table())
				require.NoError(t, err)
				out, err := tg.Do(ctx, r)
				require.NoError(t, err)
				own := settle(t, tg)
				after, err := env.Snapshot(ctx, tg.Table())
				require.NoError(t, err)
				d, err := env.Since(ctx, before, after)
				require.NoError(t, err)
				got[i] = append(got[i], cost{out, d.PGStatements, d.TupleWrites})
				redis[i] += d.RedisClient - own
			}
		}
		require.Equal(t, got[0], got[1], strategy)
		require.Equal(t, redis[0], redis[1], strategy)
		require.Equal(t, []string{"executed", "replayed", "key_reused"},
			[]string{got[0][0].outcome, got[0][1].outcome, got[0][2].outcome})
		require.Equal(t, cost{"executed", 2, 2}, got[0][0]) // claim (insert) + complete (update)
		if strategy == Table {
			// The claim reads the row, and writes nothing.
			require.Equal(t, []cost{{"replayed", 1, 0}, {"key_reused", 1, 0}}, got[0][1:])
			require.Zero(t, redis[0])
		} else {
			require.Equal(t, []cost{{"replayed", 0, 0}, {"key_reused", 0, 0}}, got[0][1:], "answered by the lease")
			// The lease (SET NX GET and PTTL) and the answer's copy; the
			// replay's and the reused key's leases.
			require.EqualValues(t, 3+2+2, redis[0])
		}
		require.True(t, env.StatsFlushable())
	}
	_, err := New(env, "nope", Guard, 0)
	require.Error(t, err)
	_, err = New(env, Table, "nope", 0)
	require.Error(t, err)
}
