package idem_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
)

// A fleet whose instances keep keys for different retentions (24 h, 1 h and
// 50 s) shares one table: a key lives at least as long as every instance
// that claimed, answered or settled it promised, whatever the others'
// retention, their sweepers or their claims. A late retry is replayed, never
// charged again; a key answered by the 50 s instance expires by its own
// promise, for every instance alike.
func TestMixedRetentionsKeepEachPromise(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		long := setup(t, strategy) // 24 h, the default
		ctx := context.Background()
		schema, _, _ := strings.Cut(strings.Trim(long.store.Table(), `"`), `"."`)
		store := func(retention time.Duration) *durable.Store {
			s, err := durable.New(long.pool, &durable.Config{Schema: schema, Retention: retention})
			require.NoError(t, err)
			return s
		}
		hour, short := store(time.Hour), store(50*time.Second)
		guard := func(s *durable.Store) *idem.Guard {
			cfg := &idem.Config{Logger: quietLogger()}
			if long.locker != nil {
				cfg.Lock = long.locker
			}
			g, err := idem.New(s, cfg)
			require.NoError(t, err)
			return g
		}
		fleet := []*idem.Guard{long.guard, guard(hour), guard(short)}
		sweep := func() int64 {
			t.Helper()
			sw, err := durable.NewSweeper(short)
			require.NoError(t, err)
			n, err := sw.SweepOnce(ctx)
			require.NoError(t, err)
			return n
		}
		var charges atomic.Int32
		charge := func(ctx context.Context) (idem.Response, error) {
			n := charges.Add(1)
			return created(idem.DeriveID("ord_", "order", idem.ExecutionFromContext(ctx).Intent) + "-" + string(rune('0'+n))), nil
		}
		age := func(key, by string) {
			t.Helper()
			ageKey(t, long.pool, long.store, key, by)
			long.forgetLease(t, "u", key) // read the row, as once the lease's copy is gone
		}
		replayedEverywhere := func(r idem.Request, want idem.Response) {
			t.Helper()
			for i, g := range fleet {
				resp, out, err := g.Do(ctx, r, charge)
				require.NoError(t, err, "instance %d", i)
				require.Equal(t, idem.OutcomeReplayed, out, "instance %d", i)
				require.Equal(t, want.Header.Get("Location"), resp.Header.Get("Location"), "instance %d", i)
			}
		}

		// Answered by the 24 h instance: still there two hours on, through
		// the 50 s instance's sweeps and claims.
		a := req("u", newKey(), "a")
		first, out, err := long.guard.Do(ctx, a, charge)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out)
		age(a.Key, "2 minutes")
		require.Zero(t, sweep())
		replayedEverywhere(a, first)
		age(a.Key, "2 hours")
		require.Zero(t, sweep())
		replayedEverywhere(a, first)

		// Claimed by the 50 s instance, left unanswered by a 503, settled
		// by the 24 h instance: the key lives the settler's 24 h.
		c := req("u", newKey(), "c")
		_, out, err = fleet[2].Do(ctx, c, func(context.Context) (idem.Response, error) {
			charges.Add(1)
			return idem.Response{Status: http.StatusServiceUnavailable}, nil
		})
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecutedUnstored, out)
		settled := created("ord_settled")
		require.NoError(t, long.guard.Settle(ctx, c.Scope, c.Key, ownerOf(t, long.store, c.Scope, c.Key), settled))
		age(c.Key, "10 minutes")
		require.Zero(t, sweep())
		replayedEverywhere(c, settled)
		require.EqualValues(t, 2, charges.Load(), "a and c, once each")

		// Answered by the 50 s instance: expired two minutes on, for every
		// instance, and swept.
		b := req("u", newKey(), "b")
		_, out, err = fleet[2].Do(ctx, b, charge)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out)
		age(b.Key, "2 minutes")
		_, err = long.store.Get(ctx, b.Scope, b.Key)
		require.ErrorIs(t, err, idem.ErrNotFound, "expired by the promise it was answered under")
		require.EqualValues(t, 1, sweep())
	})
}
