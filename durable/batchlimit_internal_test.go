package durable

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
)

// A limit that has seen statements served as fast as ever stays out of
// reach; statements that queue at the server bring it down to one below
// what was in flight, then by one per statement that queued, never below
// limitQueued; statements served at once again raise it by one each.
func TestLimitFollowsQueueing(t *testing.T) {
	var l limit
	require.True(t, l.allows(1000), "the zero limit allows any number")
	now := time.Unix(1000, 0)
	least := 200 * time.Microsecond

	for range 100 {
		l.observe(now, least, 32)
	}
	require.True(t, l.allows(1000), "32 in flight, none waiting: no limit")

	l.observe(now, 10*least, 32) // 32 × 0.9 = 28.8 waited
	require.Equal(t, 31, l.n)
	require.True(t, l.allows(30))
	require.False(t, l.allows(31))
	l.observe(now, 10*least, 31)
	require.Equal(t, 30, l.n)
	l.observe(now, 10*least, 8) // in flight below the limit: one below that
	require.Equal(t, 7, l.n)
	for range 100 {
		l.observe(now, 100*least, 7)
	}
	require.Equal(t, limitQueued, l.n, "never below limitQueued")
	l.observe(now, 100*least, limitQueued) // 3.96 waited: not more than limitQueued
	require.Equal(t, limitQueued, l.n)

	l.observe(now, 2*least, limitQueued) // 4 × 0.5 = 2 waited: neither
	require.Equal(t, limitQueued, l.n)
	l.observe(now, least, limitQueued)
	l.observe(now, least+least/10, limitQueued) // 4 × 0.09: rises
	require.Equal(t, limitQueued+2, l.n)
	for range 10 {
		l.observe(now, least, 3)
	}
	require.Equal(t, limitQueued+12, l.n)
}

// The least latency is the least of the current window and the last: a
// server that moved further away stops looking queued within two windows.
// A latency of zero is no measurement and is ignored.
func TestLimitLeastLatencyFollowsTheServer(t *testing.T) {
	var l limit
	now := time.Unix(1000, 0)
	near, far := 100*time.Microsecond, 2*time.Millisecond
	l.observe(now, near, 1)
	l.observe(now, far, 32)
	require.Equal(t, 31, l.n, "against the near latency, the far one queued")

	now = now.Add(limitWindow)
	l.observe(now, far, 32) // the near one is still the last window's
	require.Equal(t, 30, l.n)
	now = now.Add(limitWindow)
	l.observe(now, far, 32) // two windows on: far is the least
	require.Equal(t, 31, l.n, "at the least latency nothing queued: the limit rises")
	require.Equal(t, far, l.least[0])
	require.Equal(t, far, l.least[1])

	l.observe(now, 0, 32) // no latency: ignored
	require.Equal(t, far, l.least[0])
}

// A batcher holds a request back only while its kind's statements in flight
// have reached the limit, though connections are free; then the requests
// held go together as one statement when one of them returns.
func TestBatcherWaitsAtTheLimit(t *testing.T) {
	release := make(chan struct{})
	var alone, many atomic.Int64
	b := &batcher[string, string]{
		exhausted: func() bool { return false },
		busy:      new(atomic.Int64),
		maxBatch:  batchMax,
		key:       func(r *string) string { return *r },
		one: func(ctx context.Context, r *string) (string, error) {
			alone.Add(1)
			if *r == "held" {
				<-release
			}
			return "one " + *r, nil
		},
		many: func(ctx context.Context, rs []*string) ([]string, error) {
			many.Add(1)
			out := make([]string, len(rs))
			for i, r := range rs {
				out[i] = "many " + *r
			}
			return out, nil
		},
	}
	ctx := t.Context()

	// Out of reach: a request goes alone beside one in flight.
	got := make(chan string, 8)
	go func() { r, _ := b.do(ctx, "held"); got <- r }()
	require.Eventually(t, func() bool { return alone.Load() == 1 }, 10*time.Second, time.Millisecond)
	r, err := b.do(ctx, "beside")
	require.NoError(t, err)
	require.Equal(t, "one beside", r)

	b.mu.Lock()
	b.limit.n = 1 // as a limit fallen under queueing would be
	b.mu.Unlock()
	var wg sync.WaitGroup
	results, errs := make([]string, 3), make([]error, 3)
	for i := range results {
		wg.Go(func() {
			results[i], errs[i] = b.do(ctx, fmt.Sprint("k", i))
		})
	}
	require.Eventually(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue) == 3
	}, 10*time.Second, time.Millisecond, "at the limit, requests wait though connections are free")
	require.EqualValues(t, 2, alone.Load(), "none of them went alone")

	close(release)
	require.Equal(t, "one held", <-got)
	wg.Wait()
	require.Equal(t, []error{nil, nil, nil}, errs)
	require.Equal(t, []string{"many k0", "many k1", "many k2"}, results)
	require.EqualValues(t, 1, many.Load(), "the three went as one statement")
}

// A Store's claims wait for a claim statement in flight once its limit is
// reached, with connections of the pool free, and then share one statement.
func TestStoreSharesAtTheLimit(t *testing.T) {
	ctx := t.Context()
	s, pool := planStoreOf(t, &Config{})
	var shared atomic.Int64
	many := s.claims.many
	s.claims.many = func(ctx context.Context, reqs []*claimReq) ([]claimRes, error) {
		shared.Add(int64(len(reqs)))
		return many(ctx, reqs)
	}
	_, _, err := s.Claim(ctx, claimParams("u", "warm", "b")) // reads the schema version
	require.NoError(t, err)

	// A transaction inserts the first key and holds it uncommitted: the
	// claim of that key waits for it at the server, in flight.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	_, err = tx.Exec(ctx, "INSERT INTO "+s.table+" (user_id, key, request_hash, owner_token, hold_until, retention) VALUES ('u', 'first', ''::bytea, ''::bytea, now(), interval '1 hour')")
	require.NoError(t, err)
	s.claims.mu.Lock()
	s.claims.limit.n = 1 // as a limit fallen under queueing would be
	s.claims.mu.Unlock()
	state := func() (running, queued int) {
		s.claims.mu.Lock()
		defer s.claims.mu.Unlock()
		return s.claims.running, len(s.claims.queue)
	}
	waitFirst, _ := claimAll(ctx, s, []idem.ClaimParams{claimParams("u", "first", "b")})
	require.Eventually(t, func() bool { r, _ := state(); return r == 1 }, 30*time.Second, time.Millisecond)
	rest := []idem.ClaimParams{claimParams("u", "b", "b"), claimParams("u", "c", "b"), claimParams("u", "d", "b")}
	waitRest, _ := claimAll(ctx, s, rest)
	require.Eventually(t, func() bool { _, q := state(); return q == len(rest) }, 30*time.Second, time.Millisecond,
		"at the limit, the claims behind wait though the pool has free connections")
	require.Less(t, pool.Stat().AcquiredConns(), pool.Stat().MaxConns())
	require.NoError(t, tx.Rollback(ctx)) // the first key is free again: its claim inserts
	for _, got := range append(waitFirst(), waitRest()...) {
		require.NoError(t, got.err)
		require.True(t, got.claimed)
	}
	require.EqualValues(t, len(rest), shared.Load(), "the claims that waited went as one statement")
}
