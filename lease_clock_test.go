package idem_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/internal/testdb"
	"github.com/idemguard/idem/internal/testredis"
	"github.com/idemguard/idem/lock"
)

// A fleet whose hybrid instances run different lock TTLs (300 s and 30 s) on
// one Redis and one table, and a key answered while the 300 s instance's
// lease says it runs (its copy lost, or answered by a table instance). The
// 30 s instance measures the state's age against the TTL its writer gave it,
// not its own: once 6 s have passed on Redis's clock it reads the row and
// replays the answer. With Redis's clock stepped back 10 minutes the age
// cannot be told (the remaining TTL exceeds the recorded one), and the row
// decides at once. Before, the reader computed 30 s - 294 s, took it for a
// fresh lease and refused the answered key for minutes (issue 26, item 2).
func TestLeaseAgeAcrossLockTTLs(t *testing.T) {
	for _, step := range []struct {
		name      string
		remaining time.Duration // the lease's PTTL once the key is answered
	}{
		{"6s on Redis's clock", 300*time.Second - 6*time.Second},
		{"Redis's clock 10 minutes back", 300*time.Second + 10*time.Minute},
	} {
		t.Run(step.name, func(t *testing.T) {
			store, _ := testdb.Store(t, nil)
			rdb := testredis.Client(t)
			prefix := testredis.Prefix(t, rdb)
			quiet := slog.New(slog.DiscardHandler)
			newHybrid := func(ttl time.Duration) (*idem.Guard, *lock.Locker) {
				l, err := lock.New(rdb, &lock.Config{Prefix: prefix, TTL: ttl, Timeout: 5 * time.Second})
				require.NoError(t, err)
				g, err := idem.New(store, &idem.Config{Lock: l, Logger: quiet})
				require.NoError(t, err)
				return g, l
			}
			writer, wl := newHybrid(300 * time.Second)
			reader, _ := newHybrid(30 * time.Second)
			table, err := idem.New(store, &idem.Config{Logger: quiet})
			require.NoError(t, err)
			rq := req("user-1", newKey(), `{"sku":1}`)

			// The table instance runs the work; the 300 s instance's retry
			// takes the lease and writes "running" from the row.
			started, finish := make(chan struct{}), make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				_, out, err := table.Do(context.Background(), rq, func(context.Context) (idem.Response, error) {
					close(started)
					<-finish
					return created("o-1"), nil
				})
				if err != nil || out != idem.OutcomeExecuted {
					t.Errorf("table instance: %v %v", out, err)
				}
			})
			<-started
			_, out, err := writer.Do(t.Context(), rq, mustNotRun(t))
			require.Equal(t, idem.OutcomeInProgress, out)
			require.ErrorIs(t, err, idem.ErrInProgress)
			close(finish)
			wg.Wait()

			// Time passes on Redis's clock, or the clock steps back.
			require.NoError(t, rdb.PExpire(t.Context(), wl.Key(rq.Scope, rq.Key), step.remaining).Err())

			rec, err := store.Get(t.Context(), rq.Scope, rq.Key)
			require.NoError(t, err)
			require.NotNil(t, rec.Answer)
			resp, out, err := reader.Do(t.Context(), rq, mustNotRun(t))
			require.NoError(t, err, "the answered key is not refused past the 5 s bound")
			require.Equal(t, idem.OutcomeReplayed, out)
			require.Equal(t, *rec.Answer, resp)
		})
	}
}
