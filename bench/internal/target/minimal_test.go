package target

import (
	"crypto/sha256"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
)

// TestMinimalAgrees checks that the minimal target takes the guard's
// decisions on every path (executed, replayed, key_reused, and in_progress
// while another request of the key runs), and pins what it costs: the
// minimal claim returns nothing for a taken key, so its replays and refusals
// read the row in a second statement.
func TestMinimalAgrees(t *testing.T) {
	env := open(t)
	ctx := t.Context()
	// Long enough that the two requests sent while the first runs reach it
	// before it ends, on a busy machine under -race.
	const work = 500 * time.Millisecond
	type cost struct {
		outcome                     string
		statements, writes, rclient int64
	}
	for _, strategy := range []string{Table, Hybrid} {
		var decisions [3][]string
		var costs [3][]cost
		for i, impl := range []string{Guard, Ceiling, Minimal} {
			tg, err := New(env, strategy, impl, work)
			require.NoError(t, err)
			// Warm up: connections dialled, scripts loaded.
			_, err = tg.Do(ctx, idem.Request{Scope: "user-1", Key: "warm-" + strategy, Fingerprint: sha256.Sum256(nil)})
			require.NoError(t, err)
			do := func(r idem.Request) string {
				t.Helper()
				before, err := env.Snapshot(ctx, tg.Table())
				require.NoError(t, err)
				out, err := tg.Do(ctx, r)
				require.NoError(t, err)
				own := settle(t, tg)
				after, err := env.Snapshot(ctx, tg.Table())
				require.NoError(t, err)
				d, err := env.Since(ctx, before, after)
				require.NoError(t, err)
				costs[i] = append(costs[i], cost{out, d.PGStatements, d.TupleWrites, d.RedisClient - own})
				return out
			}
			req := idem.Request{Scope: "user-1", Key: "a-" + strategy, Fingerprint: sha256.Sum256([]byte("a"))}
			reused := req
			reused.Fingerprint[0] ^= 1
			// Settled key: first execution, replay, reuse.
			decisions[i] = append(decisions[i], do(req), do(req), do(reused))

			// Running key: a request holds it while two others arrive.
			running := idem.Request{Scope: "user-1", Key: "b-" + strategy, Fingerprint: sha256.Sum256([]byte("b"))}
			other := running
			other.Fingerprint[0] ^= 1
			var wg sync.WaitGroup
			var first string
			var firstErr error
			wg.Go(func() { first, firstErr = tg.Do(ctx, running) })
			table := pgx.Identifier{env.Schema, tg.Table()}.Sanitize()
			require.Eventually(t, func() bool {
				var n int
				err := env.Pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE user_id = $1 AND key = $2",
					running.Scope, running.Key).Scan(&n)
				return err == nil && n == 1
			}, 5*time.Second, 5*time.Millisecond)
			busy, err := tg.Do(ctx, running)
			require.NoError(t, err)
			busyOther, err := tg.Do(ctx, other)
			require.NoError(t, err)
			wg.Wait()
			require.NoError(t, firstErr)
			after, err := tg.Do(ctx, running)
			require.NoError(t, err)
			decisions[i] = append(decisions[i], busy, busyOther, first, after)
		}
		want := []string{"executed", "replayed", "key_reused", "in_progress", "key_reused", "executed", "replayed"}
		require.Equal(t, want, decisions[0], "guard, %s", strategy)
		require.Equal(t, decisions[0], decisions[1], "ceiling, %s", strategy)
		require.Equal(t, decisions[0], decisions[2], "minimal, %s", strategy)

		// The ceiling costs what the guard costs (TestTargetsAgree); the
		// minimal's costs, per path of the settled key:
		require.Equal(t, costs[0], costs[1], strategy)
		if strategy == Table {
			require.Equal(t, []cost{
				{"executed", 2, 2, 0},   // insert, update
				{"replayed", 2, 0, 0},   // insert (nothing), select
				{"key_reused", 2, 0, 0}, // insert (nothing), select
			}, costs[2])
		} else {
			require.Equal(t, []cost{
				{"executed", 2, 2, 1},   // SET NX, insert, update
				{"replayed", 1, 0, 1},   // SET NX refused, select
				{"key_reused", 1, 0, 1}, // SET NX refused, select
			}, costs[2])
		}
	}
	_, err := New(env, "nope", Minimal, 0)
	require.Error(t, err)
}
