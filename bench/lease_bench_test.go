package main_test

import (
	"bytes"
	"crypto/sha256"
	"flag"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idem/bench/internal/fixture"
	"github.com/idemguard/idem/bench/internal/fleet"
	"github.com/idemguard/idem/internal/testredis"
	"github.com/idemguard/idem/lock"
)

var (
	leaseCallers = flag.Int("lease-callers", 32, "BenchmarkLeaseCost: concurrent callers")
	copyPause    = flag.Duration("copy-pause", 10*time.Millisecond, "BenchmarkLeaseCost, path=copy: each caller's pause between two copies")
)

// BenchmarkLeaseCost measures what the hybrid's lease adds to a request, in
// CPU on each side: the guard process (client-cpu-µs/op: the lock, go-redis,
// the Go runtime) and the Redis server (redis-cpu-µs/op, from INFO cpu),
// and the round trips (exchanges/op). Callers run concurrently
// (-lease-callers, 32 by default), so commands share round trips as they do
// under load.
//
//   - path=first_execution: the lease of a new key (SET NX GET and PTTL),
//     then the copy of a 200-byte answer (SET): the two round trips a first
//     execution adds to the table strategy's two statements;
//   - path=replay: the lease of a key that holds a copy (SET NX GET and
//     PTTL, refused, returning the copy): all a replay costs;
//   - path=copy: the copy alone, as the hybrid claiming first sends it, each
//     caller pausing between two for a random time of mean -copy-pause
//     (exponential: 10ms, about a first execution over HTTP at 32 callers
//     here), so that the copies find no lease's exchange to ride with.
//     client-cpu-µs/op includes the pause's timer and wake-up.
//
// Both figures count everything the process and the server did during the
// run, so nothing else should run beside it:
//
//	go test -run '^$' -bench LeaseCost -benchtime 30000x -count 5 ./bench
func BenchmarkLeaseCost(b *testing.B) {
	for _, path := range []string{"first_execution", "replay", "copy"} {
		b.Run("path="+path, func(b *testing.B) {
			c := testredis.Client(b)
			var counter fixture.RedisCounter
			c.AddHook(&counter)
			l, err := lock.New(c, &lock.Config{Prefix: testredis.Prefix(b, c)})
			if err != nil {
				b.Fatal(err)
			}
			ctx := b.Context()
			// Values of the sizes the guard sends: the lease's state (a kind
			// byte and the fingerprint) and an answer's copy (the same and a
			// 200-byte answer). The lock never reads them.
			claiming := bytes.Repeat([]byte{'c'}, 1+sha256.Size)
			answerCopy := bytes.Repeat([]byte{'a'}, 1+sha256.Size+200)
			answered := make(chan error, 1)
			l.Set("s", "replayed", answerCopy, time.Hour, func(err error) { answered <- err })
			if err := <-answered; err != nil {
				b.Fatal(err)
			}
			var seq atomic.Int64
			var copies sync.WaitGroup                                     // Set does not wait: the run ends when every copy is answered
			b.SetParallelism(max(*leaseCallers/runtime.GOMAXPROCS(0), 1)) // goroutines per GOMAXPROCS
			b.ReportAllocs()
			client0, redis0, exchanges0 := processCPU(b), redisCPU(b, c), counter.Exchanges()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				rng := rand.New(rand.NewPCG(uint64(seq.Add(1)), 0))
				for pb.Next() {
					if path == "replay" {
						held, _, replace, err := l.TryLock(ctx, "s", "replayed", claiming)
						if err != nil || replace != nil || len(held) != len(answerCopy) {
							b.Errorf("replay: got %d bytes, %v", len(held), err)
							return
						}
						continue
					}
					k := strconv.FormatInt(seq.Add(1), 36)
					if path == "copy" {
						time.Sleep(time.Duration(rng.ExpFloat64() * float64(*copyPause)))
					} else if held, _, replace, err := l.TryLock(ctx, "s", k, claiming); err != nil || held != nil || replace == nil {
						b.Errorf("lease of a new key: %v", err)
						return
					}
					copies.Add(1)
					l.Set("s", k, answerCopy, time.Minute, func(err error) {
						if err != nil {
							b.Error(err)
						}
						copies.Done()
					})
				}
			})
			copies.Wait()
			b.StopTimer()
			b.ReportMetric((processCPU(b)-client0)*1e6/float64(b.N), "client-cpu-µs/op")
			b.ReportMetric((redisCPU(b, c)-redis0)*1e6/float64(b.N), "redis-cpu-µs/op")
			b.ReportMetric(float64(counter.Exchanges()-exchanges0)/float64(b.N), "exchanges/op")
		})
	}
}

// processCPU and redisCPU are the CPU seconds this process and the Redis
// server behind c have used so far.
func processCPU(tb testing.TB) float64 {
	secs, err := fleet.ProcessCPU(os.Getpid())
	if err != nil {
		tb.Fatal(err)
	}
	return secs
}

func redisCPU(tb testing.TB, c redis.UniversalClient) float64 {
	secs, err := fleet.RedisCPU(tb.Context(), c)
	if err != nil {
		tb.Fatal(err)
	}
	return secs
}
