package idem_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/clock"
	"github.com/idemguard/idem/internal/testdb"
	"github.com/idemguard/idem/reconcile"
)

// ageKey moves the row of key into the past by the interval by (such as
// '25 hours'), as if everything it records (its claim, deadline, answer,
// release) had happened that much earlier; the reconciler's scan mark, if
// any, moves before it, as no scan could have passed the row before.
func ageKey(t *testing.T, pool *pgxpool.Pool, store *durable.Store, key, by string) {
	t.Helper()
	var created time.Time
	require.NoError(t, pool.QueryRow(t.Context(), `UPDATE `+store.Table()+` SET
		created_at = created_at - $2::interval, hold_until = hold_until - $2::interval,
		completed_at = completed_at - $2::interval, released_at = released_at - $2::interval
	WHERE key = $1 RETURNING created_at`, key, by).Scan(&created))
	table := store.Table()
	state := table[:len(table)-1] + `_reconcile"`
	_, err := pool.Exec(t.Context(), `UPDATE `+state+` SET scanned_to = least(scanned_to, $1::timestamptz - interval '1 microsecond')`, created)
	require.NoError(t, err)
}

// checkout is a payment provider behind one key: it counts charges and
// answers the order its intent derives, as a reconciler's lookup rebuilds
// it.
type checkout struct {
	charges atomic.Int32
	mu      sync.Mutex
	charged map[idem.Token]bool
}

func (c *checkout) order(intent idem.Token) idem.Response {
	return created(idem.DeriveID("ord_", "order", intent))
}

// work charges, then answers status (a 504: the provider timed out after
// the charge), or panics after the charge when status is 0 (a crash).
func (c *checkout) work(status int) idem.Work {
	return func(ctx context.Context) (idem.Response, error) {
		intent := idem.ExecutionFromContext(ctx).Intent
		c.charges.Add(1)
		c.mu.Lock()
		if c.charged == nil {
			c.charged = map[idem.Token]bool{}
		}
		c.charged[intent] = true
		c.mu.Unlock()
		switch status {
		case 0:
			panic("killed after the charge")
		case http.StatusCreated:
			return c.order(intent), nil
		}
		return idem.Response{Status: status}, nil
	}
}

// resolve looks the intent up at the provider, as a real resolver does, and
// rebuilds the answer; unknown while down is set.
func (c *checkout) resolve(down *atomic.Bool) reconcile.ResolveFunc {
	return func(_ context.Context, it reconcile.Item) (reconcile.Decision, error) {
		if down.Load() {
			return reconcile.Decision{}, errors.New("provider unreachable")
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.charged[it.Intent] {
			return reconcile.Decision{Verdict: reconcile.Settled, Response: c.order(it.Intent)}, nil
		}
		return reconcile.Decision{Verdict: reconcile.NothingHappened}, nil
	}
}

// TestUnansweredKeyNeverExpires: a key left in progress (a 504 after the
// charge, a crash after it) is retried, as Retry-After says, past the
// store's retention. Each sequence ends in exactly one charge and one final
// answer: the row in progress never expires into a new intent, however old,
// and a key settled just before a retention has passed since its claim
// lives a whole retention from its answer.
func TestUnansweredKeyNeverExpires(t *testing.T) {
	for _, seq := range []string{"answered 504", "crash after the charge", "settled just before expiry"} {
		t.Run(seq, func(t *testing.T) {
			forEachStrategy(t, func(t *testing.T, strategy string) {
				b := setup(t, strategy)
				ctx := t.Context()
				var c checkout
				var down atomic.Bool
				rec, err := reconcile.New(b.guard, b.store, c.resolve(&down), nil)
				require.NoError(t, err)
				r := req("u", newKey(), `{"hold_ids":[7],"payment_method":"pm_timeout"}`)
				var finals []idem.Response
				retry := func() {
					t.Helper()
					if b.mr != nil {
						b.mr.FastForward(time.Hour) // the lease is long gone
					}
					resp, out, err := b.guard.Do(ctx, r, c.work(http.StatusCreated))
					switch out {
					case idem.OutcomeInProgress: // pending (the hybrid's lease may still say running)
						require.ErrorIs(t, err, idem.ErrInProgress)
					case idem.OutcomeReplayed, idem.OutcomeExecuted:
						finals = append(finals, resp)
					default:
						t.Fatalf("retry: %v %v", out, err)
					}
				}

				switch seq {
				case "crash after the charge":
					require.Panics(t, func() { _, _, _ = b.guard.Do(ctx, r, c.work(0)) })
				default:
					_, out, err := b.guard.Do(ctx, r, c.work(http.StatusGatewayTimeout))
					require.NoError(t, err)
					require.Equal(t, idem.OutcomeExecutedUnstored, out)
				}

				if seq == "settled just before expiry" {
					// Retried for almost a whole retention, then settled.
					ageKey(t, b.pool, b.store, r.Key, "23 hours 59 minutes 59 seconds")
					retry()
					res, err := rec.RunOnce(clock.WithHeadStart(ctx, time.Hour)) // as old on the reconciler's clock
					require.NoError(t, err)
					require.Equal(t, 1, res.Settled)
					ageKey(t, b.pool, b.store, r.Key, "2 seconds") // past created_at + retention
					retry()
				} else {
					// The provider cannot be asked for a day: the key is
					// retried past the retention, and never swept.
					down.Store(true)
					ageKey(t, b.pool, b.store, r.Key, "2 minutes")
					_, err := rec.RunOnce(clock.WithHeadStart(ctx, time.Hour)) // as old on the reconciler's clock
					require.NoError(t, err)
					for range 3 {
						ageKey(t, b.pool, b.store, r.Key, "10 hours")
						retry()
						sw, err := durable.NewSweeper(b.store)
						require.NoError(t, err)
						n, err := sw.SweepOnce(ctx)
						require.NoError(t, err)
						require.Zero(t, n, "a key in progress is never swept")
					}
					down.Store(false)
					_, err = b.pool.Exec(ctx, `UPDATE `+b.store.Table()+` SET reconcile_after = now() WHERE key = $1`, r.Key)
					require.NoError(t, err)
					res, err := rec.RunOnce(clock.WithHeadStart(ctx, time.Hour))
					require.NoError(t, err)
					require.Equal(t, 1, res.Settled)
					retry()
				}
				require.EqualValues(t, 1, c.charges.Load(), "one charge")
				require.NotEmpty(t, finals)
				for _, f := range finals {
					require.Equal(t, finals[0], f, "one final answer")
				}
			})
		})
	}
}

// TestReconcilerWaitsForTheRowsDeadline: two Guards with different
// WorkTimeouts share a table, and the reconciler is built from the short
// one. The long one's execution, older than the reconciler's MinAge but
// within its own deadline, is neither released nor settled; its answer is
// stored and replayed, after exactly one execution.
func TestReconcilerWaitsForTheRowsDeadline(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		b := setup(t, strategy, func(o *setupOpts) { o.cfg.WorkTimeout = 5 * time.Minute })
		// The default StoreTimeout: a claim may take more than 100 ms on a
		// busy machine. MaxHold stays far below the 2 minutes below.
		short, err := idem.New(b.store, &idem.Config{WorkTimeout: 100 * time.Millisecond, Logger: quietLogger()})
		require.NoError(t, err)
		ctx := t.Context()
		var resolved atomic.Int32
		rec, err := reconcile.New(short, b.store, func(context.Context, reconcile.Item) (reconcile.Decision, error) {
			resolved.Add(1)
			return reconcile.Decision{Verdict: reconcile.NothingHappened}, nil // as a lookup finds no charge yet
		}, &reconcile.Config{MinAge: short.MaxHold() + 100*time.Millisecond})
		require.NoError(t, err)

		r := req("u", newKey(), "refund")
		started, finish := make(chan struct{}), make(chan struct{})
		var runs atomic.Int32
		work := func(ctx context.Context) (idem.Response, error) {
			runs.Add(1)
			close(started)
			<-finish // a 3 s provider call, say
			return created("refund"), nil
		}
		done := make(chan idem.Outcome, 1)
		go func() {
			_, out, _ := b.guard.Do(ctx, r, work)
			done <- out
		}()
		<-started
		// Older than MinAge, well within the long Guard's own deadline.
		_, err = b.pool.Exec(ctx, `UPDATE `+b.store.Table()+` SET created_at = created_at - interval '1 minute' WHERE key = $1`, r.Key)
		require.NoError(t, err)
		for range 2 {
			// Two minutes on the reconciler's clock too: past its MinAge,
			// within the row's own hold (5 minutes and more).
			res, err := rec.RunOnce(clock.WithHeadStart(ctx, 2*time.Minute))
			require.NoError(t, err)
			require.Zero(t, res.Released+res.Settled, "the live execution is left alone")
		}
		require.Zero(t, resolved.Load())
		_, out, err := short.Do(ctx, r, work)
		require.Equal(t, idem.OutcomeInProgress, out)
		require.ErrorIs(t, err, idem.ErrInProgress)
		require.NotErrorIs(t, err, idem.ErrPending, "running, not pending")

		close(finish)
		require.Equal(t, idem.OutcomeExecuted, <-done)
		if b.mr != nil {
			b.mr.FastForward(time.Hour)
		}
		resp, out, err := short.Do(ctx, r, work)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeReplayed, out)
		require.Equal(t, "/orders/refund", resp.Header.Get("Location"))
		require.EqualValues(t, 1, runs.Load())
	})
}

// TestReleaseKeepsTheIntent: a release, by the work or by a reconciler,
// keeps the key's intent. The next attempt runs under the same intent token
// (so DeriveID and DownstreamKey give the same names) with the next attempt
// number, and the key with another request is still refused.
func TestReleaseKeepsTheIntent(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		b := setup(t, strategy)
		ctx := t.Context()
		type seen struct {
			intent  idem.Token
			attempt int
		}
		var runs []seen
		work := func(status int) idem.Work {
			return func(ctx context.Context) (idem.Response, error) {
				x := idem.ExecutionFromContext(ctx)
				intent, attempt := x.Intent, x.Attempt
				require.NotZero(t, attempt)
				runs = append(runs, seen{intent, attempt})
				if status == http.StatusCreated {
					return created(idem.DeriveID("ord_", "order", intent)), nil
				}
				return idem.Response{Status: status}, nil
			}
		}
		r := req("u", newKey(), "pay")
		_, out, _ := b.guard.Do(ctx, r, work(http.StatusTooManyRequests)) // the provider said: not now
		require.Equal(t, idem.OutcomeExecutedReleased, out)

		_, out, err := b.guard.Do(ctx, req("u", r.Key, "another body"), work(http.StatusCreated))
		require.Equal(t, idem.OutcomeKeyReused, out, "still 422 after a release")
		require.ErrorIs(t, err, idem.ErrKeyReused)

		_, out, _ = b.guard.Do(ctx, r, work(http.StatusGatewayTimeout))
		require.Equal(t, idem.OutcomeExecutedUnstored, out)
		// A reconciler finds nothing happened and releases the attempt.
		var items []reconcile.Item
		rec, err := reconcile.New(b.guard, b.store, func(_ context.Context, it reconcile.Item) (reconcile.Decision, error) {
			items = append(items, it)
			return reconcile.Decision{Verdict: reconcile.NothingHappened}, nil
		}, nil)
		require.NoError(t, err)
		ageKey(t, b.pool, b.store, r.Key, "2 minutes")
		res, err := rec.RunOnce(clock.WithHeadStart(ctx, 2*time.Minute))
		require.NoError(t, err)
		require.Equal(t, 1, res.Released)

		resp, out, err := b.guard.Do(ctx, r, work(http.StatusCreated))
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeExecuted, out)
		require.Len(t, runs, 3)
		for i, s := range runs {
			require.Equal(t, runs[0].intent, s.intent, "run %d: the same intent", i)
			require.Equal(t, i+1, s.attempt, "run %d", i)
		}
		require.Len(t, items, 1)
		require.Equal(t, runs[0].intent, items[0].Intent)
		require.Equal(t, 2, items[0].Attempt)
		require.Equal(t, "/orders/"+idem.DeriveID("ord_", "order", runs[0].intent), resp.Header.Get("Location"),
			"the order named at the first attempt")

		_, out, _ = b.guard.Do(ctx, req("u", r.Key, "another body"), work(http.StatusCreated))
		require.Equal(t, idem.OutcomeKeyReused, out)
	})
}

// TestClaimDoesNotWaitForAJoinedAnswer: a work that completed its answer
// through its own transaction and has not committed holds the row's lock.
// Retries of the key are answered 409 at once instead of waiting for the
// lock (and for StoreTimeout, a 503), and other keys are served meanwhile,
// on a pool of three connections.
func TestClaimDoesNotWaitForAJoinedAnswer(t *testing.T) {
	for _, strategy := range []string{"table", "hybrid-miniredis"} {
		t.Run("strategy="+strategy, func(t *testing.T) {
			big := testdb.Pool(t)
			cfg := &durable.Config{Schema: testdb.Schema(t, big)}
			require.NoError(t, durable.Migrate(t.Context(), big, cfg))
			pcfg := big.Config().Copy()
			pcfg.MaxConns = 3
			pool, err := pgxpool.NewWithConfig(t.Context(), pcfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			store, err := durable.New(pool, cfg)
			require.NoError(t, err)
			b := setup(t, strategy, func(o *setupOpts) {
				o.cfg.StoreTimeout = 2 * time.Second
				o.store = func(idem.Store) idem.Store { return store }
			})
			ctx := t.Context()

			r := req("u", newKey(), "pay")
			completed, commit := make(chan struct{}), make(chan struct{})
			var commitOnce sync.Once
			letCommit := func() { commitOnce.Do(func() { close(commit) }) }
			t.Cleanup(letCommit) // before the pool closes, should the test fail early
			var runs atomic.Int32
			work := func(ctx context.Context) (idem.Response, error) {
				runs.Add(1)
				tx, err := pool.Begin(ctx)
				if err != nil {
					return idem.Response{}, err
				}
				defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
				resp := created("joined")
				if err := idem.Complete(ctx, tx, resp); err != nil {
					return idem.Response{}, err
				}
				close(completed)
				<-commit // the caller's transaction is still open
				return resp, tx.Commit(ctx)
			}
			done := make(chan idem.Outcome, 1)
			go func() {
				_, out, _ := b.guard.Do(ctx, r, work)
				done <- out
			}()
			<-completed

			if b.mr != nil {
				b.mr.FastForward(time.Hour) // retries reach the claim
			}
			var wg sync.WaitGroup
			outs := make([]idem.Outcome, 6)
			for i := range outs {
				wg.Go(func() { _, outs[i], _ = b.guard.Do(ctx, r, work) })
			}
			other := req("u", newKey(), "pay")
			resp, out, err := b.guard.Do(ctx, other, (&counter{resp: created("other")}).work)
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeExecuted, out, "another key is served meanwhile")
			require.Equal(t, http.StatusCreated, resp.Status)
			wg.Wait()
			for i, out := range outs {
				require.Equal(t, idem.OutcomeInProgress, out, "retry %d: 409, not a wait for the lock", i)
			}
			letCommit()
			require.Equal(t, idem.OutcomeExecuted, <-done)
			resp, out, err = b.guard.Do(ctx, r, work)
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeReplayed, out)
			require.Equal(t, "/orders/joined", resp.Header.Get("Location"))
			require.EqualValues(t, 1, runs.Load())
		})
	}
}

// lostReply is a store whose claims commit but whose replies are lost: the
// claim call fails on its deadline after the row was written.
type lostReply struct {
	idem.Store
	lose atomic.Bool
}

func (s *lostReply) Claim(ctx context.Context, p idem.ClaimParams) (idem.Record, bool, error) {
	rec, claimed, err := s.Store.Claim(ctx, p)
	if err == nil && s.lose.Swap(false) {
		return idem.Record{}, false, context.DeadlineExceeded
	}
	return rec, claimed, err
}

// TestAmbiguousClaimIsGivenBack: a claim that committed but whose reply was
// lost (StoreTimeout expired on a stalled commit) is released by the Guard,
// owner-checked: the work did not run, and the client's retry runs it,
// instead of finding a key in progress with no execution behind it.
func TestAmbiguousClaimIsGivenBack(t *testing.T) {
	for _, strategy := range []string{"table", "hybrid-miniredis"} {
		t.Run("strategy="+strategy, func(t *testing.T) {
			var s *lostReply
			b := setup(t, strategy, func(o *setupOpts) {
				o.store = func(st idem.Store) idem.Store { s = &lostReply{Store: st}; return s }
			})
			ctx := t.Context()
			r := req("u", newKey(), "pay")
			w := &counter{resp: created("paid")}
			s.lose.Store(true)
			_, out, err := b.guard.Do(ctx, r, w.work)
			require.Equal(t, idem.OutcomeNone, out)
			require.ErrorIs(t, err, idem.ErrUnavailable)
			require.Zero(t, w.n.Load(), "the work did not run")

			resp, out, err := b.guard.Do(ctx, r, w.work)
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeExecuted, out, "the retry runs: the claim was given back")
			require.Equal(t, http.StatusCreated, resp.Status)
			require.EqualValues(t, 1, w.n.Load())
		})
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
