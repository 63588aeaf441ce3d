package idem_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/tempserver"
	"github.com/idemguard/idem/internal/testdb"
	"github.com/idemguard/idem/internal/testredis"
	"github.com/idemguard/idem/lock"
)

// A backend killed with SIGKILL (what the kernel's OOM killer does) makes
// the postmaster end every backend and recover from the WAL: whatever was
// committed but not yet written out of PostgreSQL's memory is gone. The test
// runs rounds of 32 concurrent first executions through a Guard of each
// strategy, kills an idle backend right after the round's last answer is
// acknowledged, waits for the recovery, and retries every intent through a
// table Guard (what PostgreSQL holds) and a hybrid one (which may answer from
// its Redis copy):
//
//   - by default every acknowledged answer is replayed byte for byte by both,
//     and no work runs twice: the answer write returned only once its commit
//     was on disk;
//   - with durable.Config.AsynchronousAnswers, the control, answers are lost:
//     their keys come back in progress (409), and a hybrid Guard that copied
//     the answer into Redis replays an answer PostgreSQL no longer holds (the
//     two strategies diverge). It shows that the test sees a lost answer
//     when there is one.
//
// The throwaway cluster's WAL writer waits 10 s between its rounds, so that
// an asynchronous commit stays in memory until the kill.
func TestBackendCrashKeepsAcknowledgedAnswers(t *testing.T) {
	pg := tempserver.StartPostgres(t)
	admin := poolFor(t, pg.URL(), nil)
	_, err := admin.Exec(t.Context(), "ALTER SYSTEM SET wal_writer_delay = '10s'")
	require.NoError(t, err)
	_, err = admin.Exec(t.Context(), "SELECT pg_reload_conf()")
	require.NoError(t, err)
	rc := testredis.Client(t)
	prefix := testredis.Prefix(t, rc)

	for _, async := range []bool{false, true} {
		for _, strategy := range []string{"table", "hybrid"} {
			name := fmt.Sprintf("answers=%s/strategy=%s", map[bool]string{false: "durable", true: "asynchronous"}[async], strategy)
			t.Run(name, func(t *testing.T) {
				// AdmissionWait: 32 first executions share a small pool on a
				// busy machine; this test is about durability, not admission.
				dbcfg := &durable.Config{Schema: testdb.Schema(t, admin), AsynchronousAnswers: async, AdmissionWait: time.Minute}
				require.NoError(t, durable.Migrate(t.Context(), admin, dbcfg))
				pool := poolFor(t, pg.URL(), map[string]string{"application_name": "crash-test"})
				newGuard := func(strategy string, cfg *durable.Config) *idem.Guard {
					store, err := durable.New(pool, cfg)
					require.NoError(t, err)
					gc := &idem.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
					if strategy == "hybrid" {
						l, err := lock.New(rc, &lock.Config{Prefix: prefix + name + ":"})
						require.NoError(t, err)
						gc.Lock = l
					}
					g, err := idem.New(store, gc)
					require.NoError(t, err)
					return g
				}
				g := newGuard(strategy, dbcfg)
				// The retries read with default settings: what PostgreSQL
				// holds decides, whatever wrote it.
				retryCfg := &durable.Config{Schema: dbcfg.Schema, AdmissionWait: time.Minute}
				table, hybrid := newGuard("table", retryCfg), newGuard("hybrid", retryCfg)

				const perRound = 32
				rounds := 3
				if async {
					rounds = 8 // until an answer is lost, at most
				}
				var answers, lost, diverged int
				var worstAckToKill time.Duration
				for round := range rounds {
					intents, ackToKill := crashRound(t, pg, g, fmt.Sprintf("r%d", round), perRound, pool, admin)
					worstAckToKill = max(worstAckToKill, ackToKill)
					for _, in := range intents {
						answers++
						resp, out, err := retryUnavailable(t, table, in)
						if !async {
							require.Equal(t, idem.OutcomeReplayed, out, "%s: its acknowledged answer survived the crash: %v", in.label(), err)
							require.Equal(t, in.resp, resp, "%s: replayed byte for byte", in.label())
						} else if out != idem.OutcomeReplayed {
							require.Equal(t, idem.OutcomeInProgress, out, "%s: a lost answer leaves its key in progress: %v", in.label(), err)
							lost++
						} else {
							require.Equal(t, in.resp, resp, "%s", in.label())
						}
						hresp, hout, err := retryUnavailable(t, hybrid, in)
						if hout != out {
							diverged++
						}
						if !async {
							require.Equal(t, idem.OutcomeReplayed, hout, "%s: the hybrid replays it too: %v", in.label(), err)
							require.Equal(t, in.resp, hresp, "%s: the hybrid replays it byte for byte", in.label())
						}
						require.EqualValues(t, 1, in.runs.Load(), "%s: the work ran once", in.label())
					}
					if async && lost > 0 && round >= 1 {
						break
					}
				}
				t.Logf("RELIABILITY scenario=backend-sigkill strategy=%s asynchronous_answers=%v acknowledged=%d lost=%d diverged=%d worst_ack_to_kill=%v",
					strategy, async, answers, lost, diverged, worstAckToKill.Round(time.Microsecond))
				if !async {
					require.Zero(t, lost)
					require.Zero(t, diverged)
					return
				}
				require.NotZero(t, lost, "the control loses acknowledged answers: the test can see a loss")
			})
		}
	}
}

// retryUnavailable is a client's retry of in through g: sent again, as a
// client does after a 503, while the store is unavailable (a connection of
// the pool that died with the crash, found dead only when used).
func retryUnavailable(t *testing.T, g *idem.Guard, in *standbyIntent) (idem.Response, idem.Outcome, error) {
	t.Helper()
	for range 20 {
		resp, out, err := g.Do(t.Context(), in.req, in.work)
		if !errors.Is(err, idem.ErrUnavailable) {
			return resp, out, err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return g.Do(t.Context(), in.req, in.work)
}

// crashRound runs n concurrent first executions through g, kills an idle
// backend of pg with SIGKILL as soon as the last is acknowledged, and waits
// until the server has recovered, with the dead connections of pools (g's
// first) dropped. It returns the intents with what
// their clients were told, and the time from the last acknowledgement to the
// kill.
func crashRound(t *testing.T, pg *tempserver.Postgres, g *idem.Guard, round string, n int, pools ...*pgxpool.Pool) ([]*standbyIntent, time.Duration) {
	t.Helper()
	victim, err := pgx.Connect(t.Context(), pg.URL())
	require.NoError(t, err)
	pool := pools[0]
	var pid, other int
	require.NoError(t, victim.QueryRow(t.Context(), "SELECT pg_backend_pid()").Scan(&pid))
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT pg_backend_pid()").Scan(&other))

	intents := make([]*standbyIntent, n)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		lastAck time.Time
		pending atomic.Int32
	)
	pending.Store(int32(n))
	killed := make(chan time.Duration, 1)
	for i := range intents {
		key := fmt.Sprintf("%s-%s-%d", t.Name(), round, i)
		body := make([]byte, 512)
		_, _ = rand.Read(body)
		in := &standbyIntent{req: req("buyer", key, key), answered: true}
		answer := idem.Response{
			Status: http.StatusCreated,
			Header: http.Header{"Location": {"/orders/" + key}},
			Body:   body,
		}
		in.work = func(context.Context) (idem.Response, error) {
			in.runs.Add(1)
			return answer, nil
		}
		intents[i] = in
		wg.Go(func() {
			resp, out, err := g.Do(context.Background(), in.req, in.work)
			ack := time.Now()
			if out != idem.OutcomeExecuted || err != nil {
				t.Errorf("%s: got %v, %v before the crash", in.label(), out, err)
			}
			in.resp = resp
			mu.Lock()
			lastAck = later(lastAck, ack)
			mu.Unlock()
			if pending.Add(-1) == 0 { // the last answer: kill now
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					t.Errorf("kill backend %d: %v", pid, err)
				}
				killed <- time.Since(ack)
			}
		})
	}
	wg.Wait()
	ackToKill := <-killed
	_ = victim.Close(context.Background())
	require.False(t, t.Failed(), "every intent was acknowledged before the crash")

	// The postmaster ends every backend and recovers; the connections of
	// the pools die with them. Wait until the other backend is gone and a
	// fresh connection works, dropping the dead ones.
	require.Eventually(t, func() bool {
		for _, p := range pools {
			p.Reset()
		}
		var left int
		err := pool.QueryRow(t.Context(), "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", other).Scan(&left)
		return err == nil && left == 0
	}, time.Minute, 50*time.Millisecond, "PostgreSQL ends every backend (%d among them) and recovers", other)
	return intents, ackToKill
}
