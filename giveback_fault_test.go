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
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/heavy"
	"github.com/idemguard/idem/internal/rare"
	"github.com/idemguard/idem/internal/testredis"
	"github.com/idemguard/idem/lock"
)

// giveBackSpy is the Guard's store, reporting each key whose give-back
// failed for the first time (the claim's commit, and so the give-back's,
// still waits for the standby).
type giveBackSpy struct {
	*durable.Store
	calls  atomic.Int32
	seen   sync.Map
	failed chan string
}

func (s *giveBackSpy) GiveBack(ctx context.Context, p idem.ClaimParams) error {
	if _, again := s.seen.Load(p.Key); !again {
		s.calls.Add(1)
	}
	err := s.Store.GiveBack(ctx, p)
	if err != nil && !errors.Is(err, idem.ErrNotFound) && !errors.Is(err, idem.ErrNotOwner) {
		if _, again := s.seen.LoadOrStore(p.Key, true); !again {
			s.failed <- p.Key
		}
	}
	s.seen.LoadOrStore(p.Key, true)
	return err
}

// A synchronous standby that stops answering: every commit on the primary
// waits for it, so every claim times out (StoreTimeout 300 ms) while its
// transaction is still committing, and the Guard gives it back. The
// give-back waits for the claim's transaction, and is retried while the
// standby is away; once the standby is back (started again after every
// give-back of the round has failed once), each claim is given back: over
// 100 ambiguous claims, 50 per strategy, none is left in progress, and every
// retry runs the work, once. Before, the give-back ran before the stalled
// insert was visible, found nothing and stayed silent: the key was left in
// progress with nothing running behind it (issue 26, item 3: 10 of 55).
// The last five rounds' stores insert first (warmInsertFirst).
func TestStalledStandbyClaimsAreGivenBack(t *testing.T) {
	heavy.Gate(t) // a primary and a synchronous standby
	f := startFailover(t, true)
	rc := testredis.Client(t)
	prefix := testredis.Prefix(t, rc)
	pool := poolFor(t, f.primary.URL(), nil)
	const rounds, perRound = 10, 10
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var ambiguous int
	for round := range rounds {
		strategy := []string{"table", "hybrid"}[round%2]
		store, err := durable.New(pool, nil)
		require.NoError(t, err)
		if round >= rounds/2 {
			warmInsertFirst(t, store)
		}
		spy := &giveBackSpy{Store: store, failed: make(chan string, perRound)}
		cfg := &idem.Config{StoreTimeout: 300 * time.Millisecond, WorkTimeout: 10 * time.Second, Logger: quiet}
		if strategy == "hybrid" {
			l, err := lock.New(rc, &lock.Config{Prefix: prefix, Timeout: 5 * time.Second})
			require.NoError(t, err)
			cfg.Lock = l
		}
		g, err := idem.New(spy, cfg)
		require.NoError(t, err)

		require.NoError(t, f.standby.Stop("fast"), "the synchronous standby stops answering")
		reqs := make([]idem.Request, perRound)
		runs := make([]atomic.Int32, perRound)
		work := func(i int) idem.Work {
			return func(context.Context) (idem.Response, error) {
				runs[i].Add(1)
				return idem.Response{Status: http.StatusCreated, Body: []byte(fmt.Sprint(i))}, nil
			}
		}
		var wg sync.WaitGroup
		outs := make([]idem.Outcome, perRound)
		for i := range reqs {
			reqs[i] = req("u", newKey(), "pay")
			wg.Go(func() { _, outs[i], _ = g.Do(t.Context(), reqs[i], work(i)) })
		}
		for range perRound {
			<-spy.failed // every claim's give-back waits for the standby
		}
		require.NoError(t, f.standby.Start(), "the standby is back")
		wg.Wait()
		ambiguous += int(spy.calls.Load())

		keys := make([]string, perRound)
		for i, r := range reqs {
			require.Equal(t, idem.OutcomeNone, outs[i], "round %d (%s): the claim timed out", round, strategy)
			keys[i] = r.Key
		}
		var left int
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM `+store.Table()+`
			WHERE key = ANY($1) AND response_status IS NULL AND released_at IS NULL`, keys).Scan(&left))
		require.Zero(t, left, "round %d (%s): claims left in progress with no execution behind them", round, strategy)
		for i, r := range reqs {
			_, out, err := g.Do(t.Context(), r, work(i))
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeExecuted, out, "round %d (%s): the retry runs", round, strategy)
			require.EqualValues(t, 1, runs[i].Load())
		}
	}
	require.Equal(t, rounds*perRound, ambiguous)
	t.Logf("RELIABILITY stalled synchronous standby: %d ambiguous claims (both strategies), 0 left in progress, every retry ran once", ambiguous)
}

// warmInsertFirst claims a window of new keys through store, so that it
// claims by inserting first from then on (durable.Store.Claim).
func warmInsertFirst(t *testing.T, store *durable.Store) {
	t.Helper()
	for range rare.Size {
		var p idem.ClaimParams
		p.Scope, p.Key, p.Hold = "warm", newKey(), time.Minute
		_, err := rand.Read(p.Owner[:])
		require.NoError(t, err)
		_, claimed, err := store.Claim(t.Context(), p)
		require.NoError(t, err)
		require.True(t, claimed)
	}
}
