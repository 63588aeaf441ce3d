package durable_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/testdb"
)

// BenchmarkSweepUnderLoad measures what sweeping a large backlog of expired
// rows does to the latency of the claims served meanwhile. Each iteration
// loads the backlog, then serves claims of fresh keys at a fixed rate
// (open loop: latency is measured from each claim's scheduled start, so a
// stall is not hidden by fewer requests being sent), first for a while with
// the backlog in place and no sweep, then while a Sweeper with its default
// batch size and pause deletes the backlog. It reports the claim p99 of both
// phases and their ratio (the goal: within 2x), and the sweep's throughput.
//
// Tunables, from the environment:
//
//	IDEM_BENCH_BACKLOG  expired rows to sweep (default 100000)
//	IDEM_BENCH_RATE     claims per second (default 500)
//	IDEM_BENCH_BASE     duration of the no-sweep phase (default 10s)
//	IDEM_BENCH_BATCH    SweeperConfig.BatchSize (default: the default)
//	IDEM_BENCH_PAUSE    SweeperConfig.BatchPause (default: the default)
//
// Run it alone, once per iteration:
//
//	IDEM_BENCH_BACKLOG=1000000 go test ./durable -run '^$' -bench SweepUnderLoad -benchtime 1x -timeout 30m
func BenchmarkSweepUnderLoad(b *testing.B) {
	backlog := envInt(b, "IDEM_BENCH_BACKLOG", 100_000)
	rate := envInt(b, "IDEM_BENCH_RATE", 500)
	base := 10 * time.Second
	if v := os.Getenv("IDEM_BENCH_BASE"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(b, err)
		base = d
	}
	ctx := b.Context()

	// A pool sized like a service's, shared by the claims and the sweeper.
	migrated, _ := testdb.Store(b, nil)
	pcfg, err := pgxpool.ParseConfig(testdb.URL())
	require.NoError(b, err)
	pcfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	store, err := durable.New(pool, &durable.Config{Schema: schemaOf(migrated)})
	require.NoError(b, err)
	var tune durable.SweeperTuning
	if v := os.Getenv("IDEM_BENCH_BATCH"); v != "" {
		tune.BatchSize = envInt(b, "IDEM_BENCH_BATCH", 0)
	}
	if v := os.Getenv("IDEM_BENCH_PAUSE"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(b, err)
		tune.BatchPause = d
	}
	sw, err := durable.NewSweeper(store)
	require.NoError(b, err)
	sw = durable.TuneSweeper(sw, tune)

	var baseLat, sweepLat []time.Duration
	var swept int64
	var sweepTook time.Duration
	for b.Loop() {
		_, err := pool.Exec(ctx, "TRUNCATE "+store.Table())
		require.NoError(b, err)
		_, err = pool.Exec(ctx, `
INSERT INTO `+store.Table()+` (user_id, key, request_hash, owner_token, response_status, response_headers, response_body,
	created_at, completed_at, hold_until, retention)
SELECT 'user-' || (g % 1000), 'expired-' || g, sha256(g::text::bytea), decode(md5(g::text), 'hex'),
	201, '{"Content-Type":["application/json"]}', convert_to('{"id":' || g || '}', 'UTF8'),
	now() - interval '25 hours' - g * interval '1 millisecond', now() - interval '25 hours',
	now() - interval '25 hours', interval '24 hours'
FROM generate_series(1, $1::int) AS g`, backlog)
		require.NoError(b, err)
		// Settle the load's aftermath (hint bits, dirty pages) so that it
		// does not weigh on the first phase only.
		_, err = pool.Exec(ctx, "VACUUM ANALYZE "+store.Table())
		require.NoError(b, err)
		if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
			b.Logf("CHECKPOINT (needs superuser or pg_checkpoint): %v", err)
		}

		// Phase 1: claims with the backlog in place, no sweep.
		stop := make(chan struct{})
		time.AfterFunc(base, func() { close(stop) })
		baseLat = append(baseLat, claimLoad(b, ctx, store, rate, stop)...)

		// Phase 2: claims while the backlog is swept.
		stop = make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer close(stop)
			start := time.Now()
			n, err := sw.SweepOnce(ctx)
			sweepTook += time.Since(start)
			swept += n
			if err != nil {
				b.Error(err)
			}
		}()
		sweepLat = append(sweepLat, claimLoad(b, ctx, store, rate, stop)...)
		<-done
	}
	require.EqualValues(b, int64(backlog)*int64(b.N), swept, "every expired row swept")

	p99base, p99sweep := percentile(baseLat, 0.99), percentile(sweepLat, 0.99)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(ms(percentile(baseLat, 0.50)), "p50-base-ms")
	b.ReportMetric(ms(p99base), "p99-base-ms")
	b.ReportMetric(ms(percentile(sweepLat, 0.50)), "p50-sweep-ms")
	b.ReportMetric(ms(p99sweep), "p99-sweep-ms")
	b.ReportMetric(float64(p99sweep)/float64(p99base), "p99-ratio")
	b.ReportMetric(float64(swept)/sweepTook.Seconds(), "swept-rows/s")
	b.ReportMetric(sweepTook.Seconds()/float64(b.N), "sweep-s")
	b.Logf("backlog %d rows, %d claims/s: claim p99 %.2fms without sweep (%d claims), %.2fms during sweep (%d claims), ratio %.2f; sweep %.1fs, %.0f rows/s",
		backlog, rate, ms(p99base), len(baseLat), ms(p99sweep), len(sweepLat), float64(p99sweep)/float64(p99base),
		sweepTook.Seconds()/float64(b.N), float64(swept)/sweepTook.Seconds())
}

// claimLoad claims fresh keys at rate per second until stop is closed and
// returns each claim's latency from its scheduled start.
func claimLoad(b *testing.B, ctx context.Context, store *durable.Store, rate int, stop <-chan struct{}) []time.Duration {
	var (
		mu   sync.Mutex
		lat  []time.Duration
		wg   sync.WaitGroup
		seq  atomic.Int64
		fail atomic.Int64
	)
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := 0; ; i++ {
		due := start.Add(time.Duration(i) * interval)
		select {
		case <-stop:
			wg.Wait()
			require.Zero(b, fail.Load(), "failed claims")
			return lat
		case <-time.After(time.Until(due)):
		}
		wg.Go(func() {
			p := params(b, "bench", fmt.Sprintf("live-%d-%d", start.UnixNano(), seq.Add(1)), "body")
			_, claimed, err := store.Claim(ctx, p)
			d := time.Since(due)
			if err != nil || !claimed {
				fail.Add(1)
				return
			}
			mu.Lock()
			lat = append(lat, d)
			mu.Unlock()
		})
	}
}

func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	require.NoError(b, err, name)
	require.Positive(b, n, name)
	return n
}
