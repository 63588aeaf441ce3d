package idem_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/heavy"
	"github.com/idemguard/idem/internal/tempserver"
	"github.com/idemguard/idem/internal/testredis"
	"github.com/idemguard/idem/lock"
)

// A PostgreSQL failover to a synchronous standby keeps what the guard
// acknowledged. The primary replicates to one standby, named in
// synchronous_standby_names, with synchronous_commit = on; the standby's
// replay is paused, so that what it has at the crash is flushed to its WAL
// and not yet applied (on waits for the flush, not the replay). Guards of
// both strategies, with synchronous and with asynchronous answer writes,
// run intents against the primary: some answered, some whose work is still
// running (their claims acknowledged, their answers not yet written). Right
// after the last answer is acknowledged the primary is killed (SIGKILL to
// every process of it), and the standby is promoted. Then every intent is
// retried against the promoted standby, through a guard of each strategy:
//
//   - every acknowledged claim is there: no work runs a second time (a work
//     counter per intent), and a key whose work was running is refused 409;
//   - every answer written synchronously (the default) replays byte for
//     byte;
//   - an answer written with durable.Config.AsynchronousAnswers waited for
//     neither the flush nor the standby: it replays, or it was lost and the
//     key is in progress (409) until reconciled, never run again.
//
// The control, "asynchronous", runs the same intents (table strategy) with a
// standby that is not synchronous and lags by the whole load (it is stopped
// during it): every acknowledged claim is lost, and every retry runs the work
// a second time. That is the failure the synchronous setting prevents, and it
// shows that the test sees a lost claim when there is one.
func TestSynchronousStandbyKeepsAcknowledgedClaims(t *testing.T) {
	heavy.Gate(t) // two PostgreSQL clusters per subtest
	t.Run("standby=synchronous", func(t *testing.T) {
		f := startFailover(t, true)
		rc := testredis.Client(t)
		prefix := testredis.Prefix(t, rc)
		specs := []guardSpec{
			{strategy: "table", syncAnswers: true},
			{strategy: "table", syncAnswers: false},
			{strategy: "hybrid", syncAnswers: true},
			{strategy: "hybrid", syncAnswers: false},
		}
		intents := f.run(t, specs, rc, prefix)
		f.promote(t)

		// Retried through a guard of each strategy on the promoted standby:
		// the table first (PostgreSQL alone decides), then the hybrid (whose
		// lease may still hold an answer's copy).
		var lostAsync, asyncAnswers int
		pool := poolFor(t, f.standby.URL(), nil)
		for _, retry := range []guardSpec{{strategy: "table"}, {strategy: "hybrid"}} {
			g := f.guard(t, pool, retry, rc, prefix)
			for _, in := range intents {
				resp, out, err := g.Do(t.Context(), in.req, in.work)
				what := fmt.Sprintf("retry via %s of %s (%s answers) %s", retry.strategy, in.spec.strategy, in.spec.answers(), in.label())
				switch {
				case !in.answered:
					require.Equal(t, idem.OutcomeInProgress, out, "%s: the running work's claim survived: %v", what, err)
					require.ErrorIs(t, err, idem.ErrInProgress)
				case in.spec.syncAnswers:
					require.Equal(t, idem.OutcomeReplayed, out, "%s: %v", what, err)
					require.Equal(t, in.resp, resp, "%s: replayed byte for byte", what)
				case out == idem.OutcomeReplayed:
					require.Equal(t, in.resp, resp, "%s: replayed byte for byte", what)
				default:
					require.Equal(t, idem.OutcomeInProgress, out, "%s: an asynchronous answer lost leaves the key in progress: %v", what, err)
					require.ErrorIs(t, err, idem.ErrInProgress)
				}
				if retry.strategy == "table" && in.answered && !in.spec.syncAnswers {
					asyncAnswers++
					if out != idem.OutcomeReplayed {
						lostAsync++
					}
				}
			}
		}
		var claims, syncAnswers, running int
		for _, in := range intents {
			require.EqualValues(t, 1, in.runs.Load(), "%s (%s, %s answers): the work ran once", in.label(), in.spec.strategy, in.spec.answers())
			claims++
			switch {
			case !in.answered:
				running++
			case in.spec.syncAnswers:
				syncAnswers++
			}
		}
		t.Logf("RELIABILITY scenario=failover-synchronous-standby synchronous_commit=on claims=%d kept=%d running=%d refused=%d sync_answers=%d replayed=%d async_answers=%d lost=%d max_runs=1 ack_to_kill=%v promoted_in=%v",
			claims, claims, running, running, syncAnswers, syncAnswers, asyncAnswers, lostAsync, f.ackToKill.Round(time.Microsecond), f.promoted.Round(time.Millisecond))
	})

	t.Run("standby=asynchronous", func(t *testing.T) {
		f := startFailover(t, false)
		intents := f.run(t, []guardSpec{{strategy: "table", syncAnswers: true}}, nil, "")
		f.promote(t)
		g := f.guard(t, poolFor(t, f.standby.URL(), nil), guardSpec{strategy: "table"}, nil, "")
		for _, in := range intents {
			_, out, err := g.Do(t.Context(), in.req, in.work)
			require.Equal(t, idem.OutcomeExecuted, out, "%s: the claim was lost with the primary, so the retry runs: %v", in.label(), err)
			require.EqualValues(t, 2, in.runs.Load(), "%s: the work ran twice", in.label())
		}
		t.Logf("RELIABILITY scenario=failover-asynchronous-standby claims=%d lost=%d ran_twice=%d", len(intents), len(intents), len(intents))
	})
}

// guardSpec is one kind of guard in the failover test.
type guardSpec struct {
	strategy    string // "table" or "hybrid"
	syncAnswers bool   // the default; false sets durable.Config.AsynchronousAnswers
}

func (s guardSpec) answers() string {
	if s.syncAnswers {
		return "synchronous"
	}
	return "asynchronous"
}

// standbyIntent is one intent of the failover test and what the client was
// told before the failover.
type standbyIntent struct {
	spec     guardSpec
	req      idem.Request
	answered bool          // acknowledged with OutcomeExecuted; else its work was running at the kill
	resp     idem.Response // the answer the client got, when answered
	runs     atomic.Int32  // executions of its work, before and after the failover
	work     idem.Work
}

func (in *standbyIntent) label() string { return "intent " + in.req.Key }

// failover is a primary, its standby, and what happened to them.
type failover struct {
	primary, standby *tempserver.Postgres
	stopped          bool          // the standby is stopped (the asynchronous control)
	ackToKill        time.Duration // from the last answer acknowledged to the SIGKILL
	promoted         time.Duration // pg_ctl promote, until the standby takes writes
}

// startFailover starts a primary and a streaming standby of it. When sync,
// the primary waits for the standby's flush before acknowledging a commit
// (synchronous_standby_names names it, synchronous_commit = on) and the
// standby's replay is paused; else the standby is asynchronous and is
// stopped, once the schema has reached it, so that it lags by all that
// follows.
func startFailover(t *testing.T, sync bool) *failover {
	t.Helper()
	f := &failover{primary: tempserver.StartPostgres(t)}
	admin := poolFor(t, f.primary.URL(), nil)
	require.NoError(t, durable.Migrate(t.Context(), admin, nil))
	f.standby = f.primary.StartStandby(t, "standby1")
	if !sync {
		// The standby has replayed the migration before it stops.
		require.Eventually(t, func() bool {
			var lag bool
			err := admin.QueryRow(t.Context(),
				"SELECT replay_lsn < pg_current_wal_lsn() FROM pg_stat_replication WHERE application_name = 'standby1'").Scan(&lag)
			return err == nil && !lag
		}, 30*time.Second, 20*time.Millisecond, "the standby replays the schema")
		require.NoError(t, f.standby.Stop("fast"))
		f.stopped = true
		return f
	}
	for _, sql := range []string{
		"ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 (standby1)'",
		"ALTER SYSTEM SET synchronous_commit = 'on'",
		"SELECT pg_reload_conf()",
	} {
		_, err := admin.Exec(t.Context(), sql)
		require.NoError(t, err, sql)
	}
	require.Eventually(t, func() bool {
		var state, commit string
		err := admin.QueryRow(t.Context(),
			"SELECT sync_state, current_setting('synchronous_commit') FROM pg_stat_replication WHERE application_name = 'standby1'").Scan(&state, &commit)
		return err == nil && state == "sync" && commit == "on"
	}, 30*time.Second, 20*time.Millisecond, "the standby becomes synchronous")
	sb := poolFor(t, f.standby.URL(), nil)
	_, err := sb.Exec(t.Context(), "SELECT pg_wal_replay_pause()")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var state string
		err := sb.QueryRow(t.Context(), "SELECT pg_get_wal_replay_pause_state()").Scan(&state)
		return err == nil && state == "paused"
	}, 30*time.Second, 20*time.Millisecond, "the standby's replay pauses")
	sb.Close()
	return f
}

// guard returns a Guard over pool, as spec says; a hybrid one takes its
// leases from rc under prefix.
func (f *failover) guard(t *testing.T, pool *pgxpool.Pool, spec guardSpec, rc redis.UniversalClient, prefix string) *idem.Guard {
	t.Helper()
	// AdmissionWait: every intent of a spec is sent at once.
	store, err := durable.New(pool, &durable.Config{AsynchronousAnswers: !spec.syncAnswers, AdmissionWait: time.Minute})
	require.NoError(t, err)
	cfg := &idem.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if spec.strategy == "hybrid" {
		l, err := lock.New(rc, &lock.Config{Prefix: prefix})
		require.NoError(t, err)
		cfg.Lock = l
	}
	g, err := idem.New(store, cfg)
	require.NoError(t, err)
	return g
}

// run runs, through one guard per spec on the primary: per spec, intents
// whose work is still running when the primary dies (their claims
// acknowledged: the work runs only once its claim has committed), and
// intents answered. The primary is killed as soon as the last answer is
// acknowledged. It returns every intent with what its client was told.
func (f *failover) run(t *testing.T, specs []guardSpec, rc redis.UniversalClient, prefix string) []*standbyIntent {
	t.Helper()
	const answeredPer, runningPer = 12, 3
	var (
		intents []*standbyIntent
		started sync.WaitGroup // the running intents' work has started
		release = make(chan struct{})
		running sync.WaitGroup // the running intents' Do has returned
	)
	newIntent := func(spec guardSpec, i int, answered bool) *standbyIntent {
		key := fmt.Sprintf("%s-%s-%d", spec.strategy, spec.answers(), i)
		body := make([]byte, 1024)
		_, _ = rand.Read(body)
		in := &standbyIntent{spec: spec, req: req("buyer", key, key), answered: answered}
		answer := idem.Response{
			Status: http.StatusCreated,
			Header: http.Header{"Location": {"/orders/" + key}, "Content-Type": {"application/octet-stream"}},
			Body:   body,
		}
		in.work = func(ctx context.Context) (idem.Response, error) {
			in.runs.Add(1)
			return answer, nil
		}
		intents = append(intents, in)
		return in
	}
	pool := poolFor(t, f.primary.URL(), nil)
	guards := make([]*idem.Guard, len(specs))
	for i, spec := range specs {
		guards[i] = f.guard(t, pool, spec, rc, prefix)
	}

	for i, spec := range specs {
		for n := range runningPer {
			in := newIntent(spec, answeredPer+n, false)
			started.Add(1)
			var once sync.Once // started is done when the work starts, or when Do returns without it
			running.Go(func() {
				_, out, err := guards[i].Do(context.Background(), in.req, func(ctx context.Context) (idem.Response, error) {
					in.runs.Add(1)
					once.Do(started.Done)
					<-release
					return idem.Response{Status: http.StatusCreated}, nil
				})
				once.Do(started.Done)
				if out != idem.OutcomeExecutedUnstored {
					t.Errorf("%s: the answer of work running at the crash is not stored: got %v, %v", in.label(), out, err)
				}
			})
		}
	}
	started.Wait()

	var answered sync.WaitGroup
	var mu sync.Mutex
	var lastAck time.Time
	for i, spec := range specs {
		for n := range answeredPer {
			in := newIntent(spec, n, true)
			answered.Go(func() {
				resp, out, err := guards[i].Do(context.Background(), in.req, in.work)
				ack := time.Now()
				if out != idem.OutcomeExecuted || err != nil {
					t.Errorf("%s: got %v, %v before the crash", in.label(), out, err)
				}
				in.resp = resp
				mu.Lock()
				lastAck = later(lastAck, ack)
				mu.Unlock()
			})
		}
	}
	answered.Wait()
	f.ackToKill = time.Since(lastAck)
	require.NoError(t, f.primary.Kill())
	close(release)
	running.Wait()
	require.False(t, t.Failed(), "every intent was acknowledged before the crash")
	return intents
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// promote promotes the standby, starting it first if it was stopped.
func (f *failover) promote(t *testing.T) {
	t.Helper()
	if f.stopped {
		require.NoError(t, f.standby.Start())
	}
	began := time.Now()
	require.NoError(t, f.standby.Promote())
	f.promoted = time.Since(began)
}
