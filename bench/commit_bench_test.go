package main_test

import (
	"crypto/rand"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/testdb"
)

// BenchmarkCommitModes measures a first execution's two writes, the claim
// and the answer, through *durable.Store on the real schema, with each
// committed either waiting for its WAL flush (synchronous_commit on, the
// server default) or not (off, set as a connection parameter of a pool used
// only for that write: no extra statement). Closed loop, 8 and 32 callers,
// reported as executions per second. It decides which write may skip the
// flush: docs/strategies.md, "Disk flushes".
//
//	go test -run '^$' -bench CommitModes -benchtime 3s -count 5 ./bench
func BenchmarkCommitModes(b *testing.B) {
	for _, mode := range []struct {
		name                    string
		claimAsync, answerAsync bool
	}{
		{"claim=sync/answer=sync", false, false},
		{"claim=sync/answer=async", false, true},
		{"claim=async/answer=sync", true, false},
		{"claim=async/answer=async", true, true},
	} {
		for _, conc := range []int{8, 32} {
			b.Run(fmt.Sprintf("%s/conc=%d", mode.name, conc), func(b *testing.B) {
				store, _ := testdb.Store(b, nil)
				syncDB, asyncDB := commitPool(b, conc, "on"), commitPool(b, conc, "off")
				claims, answers := store.WithDB(syncDB), store.WithDB(syncDB)
				if mode.claimAsync {
					claims = store.WithDB(asyncDB)
				}
				if mode.answerAsync {
					answers = store.WithDB(asyncDB)
				}
				firstExecutions(b, conc, claims, answers)
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "execs/s")
			})
		}
	}
}

// firstExecutions runs a first execution's two writes, claim then answer,
// through claims and answers (the same store, maybe over different pools),
// closed loop with conc callers, each on a fresh key.
func firstExecutions(b *testing.B, conc int, claims, answers *durable.Store) {
	run := rand.Text()[:8]
	var seq atomic.Int64
	b.SetParallelism((conc + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		a := answer
		for pb.Next() {
			p := idem.ClaimParams{Scope: "user-42", Key: run + strconv.FormatInt(seq.Add(1), 10),
				Fingerprint: idem.Fingerprint{1}, Owner: idem.Token{1}}
			if _, ok, err := claims.Claim(b.Context(), p); err != nil || !ok {
				b.Fatalf("claim: %v %v", ok, err)
			}
			if err := answers.Complete(b.Context(), p.Scope, p.Key, p.Owner, a); err != nil {
				b.Fatalf("complete: %v", err)
			}
		}
	})
}

// commitPool is a pool of conc connections with synchronous_commit set.
func commitPool(b *testing.B, conc int, syncCommit string) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(testdb.URL())
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = int32(conc)
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = syncCommit
	pool, err := pgxpool.NewWithConfig(b.Context(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// BenchmarkFillfactor runs first executions (claim, then a 201 with a
// Location and its body) on the real schema with the table's fillfactor set
// to each value, 8 callers, and reports the share of answer writes that were
// HOT updates (hot-%) and the heap's size per thousand keys (heap-kB/1k-keys).
// It chose the migration's fillfactor: docs/configuration.md, "Schema and
// migrations".
//
//	go test -run '^$' -bench Fillfactor -benchtime 40000x ./bench
func BenchmarkFillfactor(b *testing.B) {
	for _, ff := range []int{100, 95, 90, 80} {
		b.Run(fmt.Sprintf("fillfactor=%d", ff), func(b *testing.B) {
			store, pool := testdb.Store(b, nil)
			if _, err := pool.Exec(b.Context(), fmt.Sprintf("ALTER TABLE %s SET (fillfactor = %d)", store.Table(), ff)); err != nil {
				b.Fatal(err)
			}
			db := commitPool(b, 8, "on")
			firstExecutions(b, 8, store.WithDB(db), store.WithDB(db))
			b.StopTimer()
			// Statistics reach the shared counters when a backend goes idle,
			// at most once a second: wait until every update is counted.
			var upd, hot, heap int64
			deadline := time.Now().Add(10 * time.Second)
			for upd < int64(b.N) && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
				if err := pool.QueryRow(b.Context(), `SELECT n_tup_upd, n_tup_hot_upd, pg_relation_size(relid)
FROM pg_stat_user_tables WHERE relid = $1::regclass`, store.Table()).Scan(&upd, &hot, &heap); err != nil {
					b.Fatal(err)
				}
			}
			if upd < int64(b.N) {
				b.Fatalf("%d updates counted of %d", upd, b.N)
			}
			b.ReportMetric(100*float64(hot)/float64(upd), "hot-%")
			b.ReportMetric(float64(heap)/1024/(float64(b.N)/1000), "heap-kB/1k-keys")
		})
	}
}
