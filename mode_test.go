package idem_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/lock"
)

// While duplicates are rare the hybrid claims first: a first execution
// takes no lease (a retry of it is answered by the row), its answer is
// still copied into the lease, and the first duplicates past the threshold
// bring the lease back in front, where the copy answers them without
// PostgreSQL.
func TestClaimFirstWhileDuplicatesAreRare(t *testing.T) {
	forEachHybrid(t, func(t *testing.T, strategy string) {
		r := newLeaseRig(t, strategy, nil, nil)
		idem.SetLeaseModes(r.guard, 8, 0, 2)
		ok := &counter{resp: created("o")}
		for range 8 {
			_, out, _, err := r.do(t, req("u", newKey(), "x"), ok.work)
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeExecuted, out)
		}
		require.True(t, idem.ClaimsFirst(r.guard), "a window without duplicates")
		require.Zero(t, r.guard.Stats().ClaimsFirst)

		k := req("u", newKey(), "x")
		started, finish := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, _, err := r.guard.Do(context.Background(), k, func(context.Context) (idem.Response, error) {
				close(started)
				<-finish
				return created("k"), nil
			})
			done <- err
		}()
		<-started
		_, _, err := r.locker.Peek(t.Context(), k.Scope, k.Key)
		require.ErrorIs(t, err, lock.ErrNotHeld, "claiming first takes no lease")
		_, out, calls, err := r.do(t, k, mustNotRun(t))
		require.ErrorIs(t, err, idem.ErrInProgress)
		require.Equal(t, idem.OutcomeInProgress, out)
		require.EqualValues(t, 1, calls, "the retry is answered by the row")
		close(finish)
		require.NoError(t, <-done)
		require.Positive(t, r.leaseTTL(t, k), "the answer is copied into the lease")
		require.True(t, idem.ClaimsFirst(r.guard), "one duplicate, below the threshold")

		resp, out, calls, err := r.do(t, k, mustNotRun(t))
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeReplayed, out)
		require.EqualValues(t, 1, calls, "claiming first, a replay reads the row")
		require.Equal(t, r.rowAnswer(t, k), resp)
		require.False(t, idem.ClaimsFirst(r.guard), "the second duplicate brings the lease back in front")
		require.EqualValues(t, 3, r.guard.Stats().ClaimsFirst, "k's execution, its 409 and its replay")

		before := r.guard.Stats().LeaseAnswers
		resp, out, calls, err = r.do(t, k, mustNotRun(t))
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeReplayed, out)
		require.Zero(t, calls, "the copy answers the replay")
		require.Equal(t, r.rowAnswer(t, k), resp)
		require.Equal(t, before+1, r.guard.Stats().LeaseAnswers)
	})
}

// Two hybrid instances whose modes switch every few requests, under load
// that alternates between storms of retries and new keys only, with reused
// keys: every intent's work runs at most once, every request that got an
// answer got the one its row holds, and a reused key is never answered with
// another request's answer.
func TestLeaseModesSwitchUnderLoad(t *testing.T) {
	a := newLeaseRig(t, "hybrid", nil, nil)
	b := &leaseRig{store: a.store, redis: a.redis, locker: a.locker, prefix: a.prefix, cfg: a.cfg}
	b.count = &countingStore{Store: a.store}
	g, err := idem.New(b.count, &b.cfg)
	require.NoError(t, err)
	b.guard = g
	rigs := []*leaseRig{a, b}
	for _, r := range rigs {
		idem.SetLeaseModes(r.guard, 16, 1, 3)
	}

	const callers, perCaller = 8, 100
	var (
		mu       sync.Mutex
		started  []idem.Request // new intents, from the moment they are sent
		executed []idem.Request // intents that ran, once their request returned
		runs     sync.Map       // key -> *atomic.Int32
		answered sync.Map       // key -> *sync.Map of the bodies its requests got
	)
	work := func(key string) idem.Work {
		return func(ctx context.Context) (idem.Response, error) {
			n, _ := runs.LoadOrStore(key, new(atomic.Int32))
			run := n.(*atomic.Int32).Add(1)
			time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond) // retries meet it running
			// A body of its own per execution: a second one would show.
			return created(fmt.Sprintf("%s-run-%d", key, run)), nil
		}
	}
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			for i := range perCaller {
				storm := (i/25)%2 == 1 // 25 calm requests, then 25 of a storm
				mu.Lock()
				var rq idem.Request
				reused := false
				switch roll := rng.IntN(20); {
				case len(executed) > 0 && storm && roll == 0:
					// A client bug: a key whose request has run, with
					// another body.
					rq = executed[len(executed)-1-rng.IntN(min(len(executed), 16))]
					rq.Fingerprint = idem.HashRequest("POST", "/orders", []byte("another body "+strconv.Itoa(i)))
					reused = true
				case len(started) > 0 && storm && roll < 16:
					rq = started[len(started)-1-rng.IntN(min(len(started), 16))]
				default:
					rq = req("u", newKey(), "body")
					started = append(started, rq)
				}
				mu.Unlock()
				resp, out, err := rigs[rng.IntN(2)].guard.Do(context.Background(), rq, work(rq.Key))
				if out == idem.OutcomeExecuted {
					mu.Lock()
					executed = append(executed, rq)
					mu.Unlock()
				}
				switch {
				case reused:
					assert.ErrorIs(t, err, idem.ErrKeyReused, "key %s", rq.Key)
					continue
				case out == idem.OutcomeInProgress:
					assert.ErrorIs(t, err, idem.ErrInProgress)
					continue
				case err != nil:
					t.Errorf("key %s: outcome %v, err %v", rq.Key, out, err)
					continue
				}
				v, _ := answered.LoadOrStore(rq.Key, &sync.Map{})
				v.(*sync.Map).Store(string(resp.Body), true)
			}
		})
	}
	wg.Wait()

	for _, r := range rigs {
		s := r.guard.Stats()
		require.Positive(t, s.ClaimsFirst, "each instance claimed first")
		require.Positive(t, s.LeaseAnswers, "each instance leased first")
		require.Zero(t, s.DoubleExecutions)
	}
	ran := 0
	runs.Range(func(k, v any) bool {
		require.EqualValues(t, 1, v.(*atomic.Int32).Load(), "key %s ran more than once", k)
		ran++
		return true
	})
	require.Len(t, executed, ran, "every intent that ran answered its request")
	answered.Range(func(k, v any) bool {
		rec, err := a.store.Get(t.Context(), "u", k.(string))
		require.NoError(t, err)
		require.NotNil(t, rec.Answer)
		v.(*sync.Map).Range(func(body, _ any) bool {
			require.Equal(t, string(rec.Answer.Body), body.(string), "key %s: every request got the row's answer", k)
			return true
		})
		return true
	})
}
