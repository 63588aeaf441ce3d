package main_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/testdb"
)

// BenchmarkNotifyCost measures what announcing answers (durable.Config.Notify,
// needed for waiting) costs a first execution's writes: claim + complete, with
// and without the pg_notify in the complete statement, closed loop at 8 and 32
// callers, in executions per second.
//
//	go test -run '^$' -bench NotifyCost -benchtime 2s -count 3 ./bench
func BenchmarkNotifyCost(b *testing.B) {
	for _, notify := range []bool{false, true} {
		for _, conc := range []int{8, 32} {
			b.Run(fmt.Sprintf("notify=%v/conc=%d", notify, conc), func(b *testing.B) {
				store, _ := testdb.Store(b, &durable.Config{Notify: notify})
				s := store.WithDB(commitPool(b, conc, "on"))
				firstExecutions(b, conc, s, s)
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "execs/s")
			})
		}
	}
}

// BenchmarkWaitLatency measures how long a retry that arrives 10ms into a
// 50ms execution takes to get the answer: waiting (WaitFor, woken by the
// announcement) against being refused with 409 and coming back after
// Retry-After (1s), as an obedient client does. Reported as ms-to-answer;
// each op is one such retry. Table strategy, real PostgreSQL.
//
//	go test -run '^$' -bench WaitLatency -benchtime 20x ./bench
func BenchmarkWaitLatency(b *testing.B) {
	const (
		workTime = 50 * time.Millisecond
		arrive   = 10 * time.Millisecond
	)
	for _, mode := range []string{"wait", "retry-after"} {
		b.Run("mode="+mode, func(b *testing.B) {
			store, _ := testdb.Store(b, &durable.Config{Notify: true})
			l, err := durable.NewListener(b.Context(), store)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = l.Close() })
			cfg := &idem.Config{Logger: discard, Waiter: l}
			if mode == "wait" {
				cfg.Wait = 5 * time.Second
			}
			g, err := idem.New(store, cfg)
			if err != nil {
				b.Fatal(err)
			}
			slow := func(ctx context.Context) (idem.Response, error) {
				time.Sleep(workTime)
				return answer, nil
			}
			var total time.Duration
			i := 0
			for b.Loop() {
				i++
				req := request(mode + "-" + rand.Text()[:8] + strconv.Itoa(i))
				var wg sync.WaitGroup
				wg.Go(func() { _, _, _ = g.Do(context.Background(), req, slow) })
				time.Sleep(arrive)
				start := time.Now()
				for {
					_, out, _ := g.Do(context.Background(), req, work)
					if out != idem.OutcomeInProgress {
						break
					}
					time.Sleep(time.Second) // the in-progress Retry-After's hint
				}
				total += time.Since(start)
				wg.Wait()
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(i), "ms-to-answer")
		})
	}
}
