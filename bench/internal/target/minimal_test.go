package target

import (
	"context"
	"crypto/sha256"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
)

// gate is a target's work that returns at once while open, and while
// closed waits to be opened, after telling entered that it runs (the claim
// is then committed, and in the hybrid the lease taken).
type gate struct {
	mu      sync.Mutex
	closed  chan struct{} // nil while open
	entered chan struct{}
}

func newGate() *gate { return &gate{entered: make(chan struct{}, 1)} }

func (g *gate) work(ctx context.Context) error {
	g.mu.Lock()
	closed := g.closed
	g.mu.Unlock()
	if closed == nil {
		return nil
	}
	g.entered <- struct{}{}
	select {
	case <-closed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// close makes the next work wait until open is called.
func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = make(chan struct{})
}

func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.closed)
	g.closed = nil
}

// TestMinimalAgrees checks that the minimal target takes the guard's
// decisions on every path (executed, replayed, key_reused, and in_progress
// while another request of the key runs), and pins what it costs: the
// minimal claim returns nothing for a taken key, so its replays and refusals
// read the row in a second statement. The guard's answer copy does not wait
// (TestTargetsAgree), so the guard's and the ceiling's Redis commands are
// compared over the three requests of the settled key together.
func TestMinimalAgrees(t *testing.T) {
	env := open(t)
	ctx := t.Context()
	type cost struct {
		outcome            string
		statements, writes int64
	}
	for _, strategy := range []string{Table, Hybrid} {
		var decisions [3][]string
		var costs [3][]cost
		var redis [3][]int64 // per request, and the settled key's total last
		for i, impl := range []string{Guard, Ceiling, Minimal} {
			g := newGate()
			tg, err := newTarget(env, strategy, impl, g.work)
			require.NoError(t, err)
			// Warm up: connections dialled, scripts loaded; the replay
			// goes after the first request's copy.
			warm := idem.Request{Scope: "user-1", Key: "warm-" + strategy, Fingerprint: sha256.Sum256(nil)}
			for range 2 {
				_, err = tg.Do(ctx, warm)
				require.NoError(t, err)
			}
			snapshot := func() Counters {
				t.Helper()
				c, err := env.Snapshot(ctx, tg.Table())
				require.NoError(t, err)
				return c
			}
			do := func(r idem.Request) string {
				t.Helper()
				before := snapshot()
				out, err := tg.Do(ctx, r)
				require.NoError(t, err)
				d, err := env.Since(ctx, before, snapshot())
				require.NoError(t, err)
				costs[i] = append(costs[i], cost{out, d.PGStatements, d.TupleWrites})
				redis[i] = append(redis[i], d.RedisClient)
				return out
			}
			req := idem.Request{Scope: "user-1", Key: "a-" + strategy, Fingerprint: sha256.Sum256([]byte("a"))}
			reused := req
			reused.Fingerprint[0] ^= 1
			// Settled key: first execution, replay, reuse. The copy goes
			// out ahead of the replay's lease, on the same Locker, so the
			// whole window counts it exactly once.
			start := snapshot()
			decisions[i] = append(decisions[i], do(req), do(req), do(reused))
			redis[i] = append(redis[i], snapshot().RedisClient-start.RedisClient)

			// Running key: a request holds it while two others arrive.
			running := idem.Request{Scope: "user-1", Key: "b-" + strategy, Fingerprint: sha256.Sum256([]byte("b"))}
			other := running
			other.Fingerprint[0] ^= 1
			g.close()
			var wg sync.WaitGroup
			var first string
			var firstErr error
			wg.Go(func() { first, firstErr = tg.Do(ctx, running) })
			<-g.entered
			busy, err := tg.Do(ctx, running)
			require.NoError(t, err)
			busyOther, err := tg.Do(ctx, other)
			require.NoError(t, err)
			g.open()
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
		require.Equal(t, redis[0][3], redis[1][3], "Redis commands of the settled key, %s", strategy)
		if strategy == Table {
			require.Equal(t, []cost{
				{"executed", 2, 2},   // insert, update
				{"replayed", 2, 0},   // insert (nothing), select
				{"key_reused", 2, 0}, // insert (nothing), select
			}, costs[2])
			require.Equal(t, []int64{0, 0, 0, 0}, redis[2])
		} else {
			require.Equal(t, []cost{
				{"executed", 2, 2},   // SET NX, insert, update
				{"replayed", 1, 0},   // SET NX refused, select
				{"key_reused", 1, 0}, // SET NX refused, select
			}, costs[2])
			require.Equal(t, []int64{1, 1, 1, 3}, redis[2], "one SET NX each, the minimal waits for all")
		}
	}
	_, err := New(env, "nope", Minimal, 0)
	require.Error(t, err)
}
