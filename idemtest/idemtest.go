// Package idemtest holds test helpers for users and implementers of idem.
//
// [RunStoreSuite] is the conformance suite of idem.Store: any alternative
// store (another database, an in-memory fake for tests) must pass it to be
// used behind an idem.Guard. It checks, through the interface only, the
// promises the Guard relies on: one winner among racing claims, isolation
// of scopes, takeover of expired keys (and never of a key in progress),
// owner-only completion and release, a release that keeps the key's intent
// for its next attempt, the owner's deadline (HoldUntil), answers stored
// byte for byte, and, when the store has one, the sweep of expired rows.
//
// The suite needs two things the interface cannot do, supplied by a
// [Harness]: a fresh store per subtest, and a way to make a row older (so
// that expiry is tested without waiting). Run it from a test of your store:
//
//	func TestConformance(t *testing.T) {
//		idemtest.RunStoreSuite(t, idemtest.Harness{
//			New: func(t *testing.T) idem.Store { return mystore.NewForTest(t) },
//			Age: func(t *testing.T, s idem.Store, scope, key string, by time.Duration) {
//				s.(*mystore.Store).ShiftCreatedAt(scope, key, -by)
//			},
//		})
//	}
//
// The PostgreSQL store runs it in durable/conformance_test.go.
//
// [MemStore] is an in-memory store for users' unit tests, handlers that
// store their answer with idem.Complete included; what the handler's real
// transaction does to that answer is tested with package idemtest/pgtest,
// which gives each test a PostgreSQL store of its own.
package idemtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
)

// Harness is what [RunStoreSuite] needs from a store's test.
type Harness struct {
	// New returns a fresh, empty store, isolated from every other store New
	// returns (its own schema, table or namespace), and cleans it up with
	// t.Cleanup. Subtests run in parallel, so New must be safe for
	// concurrent use. Required.
	New func(t *testing.T) idem.Store
	// Age makes the row of (scope, key) older by `by` (positive), as if it
	// had been created `by` earlier, whether it is live or expired, in
	// progress, finished or released: every time the row holds (its claim,
	// answer, release and hold) moves back by `by`. Required.
	Age func(t *testing.T, s idem.Store, scope, key string, by time.Duration)
	// Sweep, when set, deletes the expired rows of s and returns how many
	// it deleted. The sweep subtest is skipped when it is nil.
	Sweep func(t *testing.T, s idem.Store) (int64, error)
}

// RunStoreSuite runs the conformance suite against the stores h.New
// returns, as parallel subtests of t. Every subtest uses a store of its own.
// It fails t (through the subtests) where the store breaks a promise.
func RunStoreSuite(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil || h.Age == nil {
		t.Fatal("idemtest: Harness.New and Harness.Age are required")
	}
	for _, tc := range storeCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, &suite{h: h, s: h.New(t), ctx: t.Context()})
		})
	}
}

// suite is one subtest's store and helpers.
type suite struct {
	h   Harness
	s   idem.Store
	ctx context.Context
}

func (x *suite) expire(t *testing.T, scope, key string) {
	t.Helper()
	x.h.Age(t, x.s, scope, key, x.s.Retention()+time.Hour)
}

func (x *suite) claim(t *testing.T, p idem.ClaimParams) idem.Record {
	t.Helper()
	rec, claimed, err := x.s.Claim(x.ctx, p)
	require.NoError(t, err)
	require.True(t, claimed, "claim of %s/%s", p.Scope, p.Key)
	return rec
}

func (x *suite) lose(t *testing.T, p idem.ClaimParams) idem.Record {
	t.Helper()
	rec, claimed, err := x.s.Claim(x.ctx, p)
	require.NoError(t, err)
	require.False(t, claimed, "claim of %s/%s", p.Scope, p.Key)
	return rec
}

func (x *suite) get(t *testing.T, scope, key string) idem.Record {
	t.Helper()
	rec, err := x.s.Get(x.ctx, scope, key)
	require.NoError(t, err)
	return rec
}

func (x *suite) notFound(t *testing.T, scope, key string) {
	t.Helper()
	_, err := x.s.Get(x.ctx, scope, key)
	require.ErrorIs(t, err, idem.ErrNotFound)
}

func newToken(t *testing.T) idem.Token {
	t.Helper()
	var tok idem.Token
	_, err := rand.Read(tok[:])
	require.NoError(t, err)
	return tok
}

func params(t *testing.T, scope, key, body string) idem.ClaimParams {
	return idem.ClaimParams{Scope: scope, Key: key, Fingerprint: sha256.Sum256([]byte(body)), Owner: newToken(t),
		Intent: newToken(t), Hold: time.Minute}
}

// answer is an answer with everything that must survive a round trip.
func answer() idem.Response {
	return idem.Response{
		Status: http.StatusCreated,
		Header: http.Header{
			"Location":     {"/orders/1"},
			"Content-Type": {"application/json; charset=utf-8"},
			"Link":         {"</a>; rel=a", "</b>; rel=b", "</a>; rel=a"}, // order and duplicates kept
			"X-Unicode":    {"héllo ✓"},
		},
		Body: []byte{0x00, 0xff, '{', '"', 'a', '"', ':', 0x00, '}', 0x80, '\n', 0x00},
	}
}

// requireAnswer checks that rec holds want, byte for byte. A nil Header or
// Body may come back empty.
func requireAnswer(t *testing.T, want idem.Response, rec idem.Record) {
	t.Helper()
	require.NotNil(t, rec.Answer, "the row has an answer")
	require.False(t, rec.InProgress())
	require.False(t, rec.CompletedAt.IsZero(), "CompletedAt is set on a finished row")
	got := *rec.Answer
	require.Equal(t, want.Status, got.Status)
	if len(want.Header) == 0 {
		require.Empty(t, got.Header)
	} else {
		require.Equal(t, want.Header, got.Header)
	}
	require.True(t, bytes.Equal(want.Body, got.Body), "body %x, want %x", got.Body, want.Body)
}

var storeCases = []struct {
	name string
	fn   func(t *testing.T, x *suite)
}{
	{"claim/wins a new key", func(t *testing.T, x *suite) {
		p := params(t, "user-1", "key-1", "a")
		rec := x.claim(t, p)
		require.Equal(t, p.Scope, rec.Scope)
		require.Equal(t, p.Key, rec.Key)
		require.Equal(t, p.Fingerprint, rec.Fingerprint)
		require.Equal(t, p.Owner, rec.Owner)
		require.Equal(t, p.Intent, rec.Intent)
		require.Equal(t, 1, rec.Attempt)
		require.True(t, rec.InProgress())
		require.False(t, rec.CreatedAt.IsZero())
		require.Equal(t, rec.CreatedAt.Add(p.Hold), rec.HoldUntil, "the owner's deadline: its claim + Hold")
		require.True(t, rec.CompletedAt.IsZero())
		require.GreaterOrEqual(t, rec.Age, time.Duration(0), "the claim's own statement: no older than the claim")
		require.Less(t, rec.Age, p.Hold, "the claim's own statement")
		require.Greater(t, rec.TTL, time.Duration(0), "a new row lives")
		require.LessOrEqual(t, rec.TTL, x.s.Retention(), "no longer than the retention")
		again := x.get(t, p.Scope, p.Key)
		require.LessOrEqual(t, again.TTL, rec.TTL, "a later read finds less life left")
		require.GreaterOrEqual(t, again.Age, rec.Age, "a later read finds the attempt older")
		again.TTL, again.Age = rec.TTL, rec.Age
		require.Equal(t, rec, again)

		q := params(t, "user-1", "key-2", "a")
		q.Intent = idem.Token{}
		require.Equal(t, q.Owner, x.claim(t, q).Intent, "a zero Intent is the Owner")
	}},

	{"complete/refuses a header value JSON would change", func(t *testing.T, x *suite) {
		p := params(t, "user-1", "key-1", "a")
		x.claim(t, p)
		err := x.s.Complete(x.ctx, p.Scope, p.Key, p.Owner,
			idem.Response{Status: 200, Header: http.Header{"Etag": {"caf\xe9"}}})
		require.ErrorIs(t, err, idem.ErrInvalid, "invalid UTF-8 would be stored as U+FFFD")
		require.True(t, x.get(t, p.Scope, p.Key).InProgress(), "nothing written")
	}},

	{"claim/loses to an in-progress row and gets it", func(t *testing.T, x *suite) {
		first := params(t, "user-1", "key-1", "a")
		x.claim(t, first)
		rec := x.lose(t, params(t, "user-1", "key-1", "b"))
		require.Equal(t, first.Fingerprint, rec.Fingerprint, "the first request's fingerprint")
		require.Equal(t, first.Owner, rec.Owner)
		require.True(t, rec.InProgress())
	}},

	{"claim/loses to a finished row and gets its answer", func(t *testing.T, x *suite) {
		p := params(t, "user-1", "key-1", "a")
		x.claim(t, p)
		require.NoError(t, x.s.Complete(x.ctx, p.Scope, p.Key, p.Owner, answer()))
		retry := p
		retry.Owner = newToken(t)
		rec := x.lose(t, retry)
		require.Equal(t, p.Fingerprint, rec.Fingerprint)
		requireAnswer(t, answer(), rec)
	}},

	{"claim/one winner among 64 racing claims", func(t *testing.T, x *suite) {
		race(t, x, func() {})
	}},

	{"claim/one winner among 64 racing takeovers of an expired key", func(t *testing.T, x *suite) {
		old := params(t, "user-1", "key-1", "old")
		x.claim(t, old)
		require.NoError(t, x.s.Complete(x.ctx, old.Scope, old.Key, old.Owner, answer()))
		race(t, x, func() { x.expire(t, old.Scope, old.Key) })
	}},

	{"claim/one winner among 64 racing takeovers of a released key", func(t *testing.T, x *suite) {
		old := params(t, "user-1", "key-1", "same body")
		x.claim(t, old)
		race(t, x, func() { require.NoError(t, x.s.Release(x.ctx, old.Scope, old.Key, old.Owner)) })
		require.Equal(t, old.Intent, x.get(t, old.Scope, old.Key).Intent)
	}},

	{"scopes are isolated", func(t *testing.T, x *suite) {
		a := params(t, "user-a", "key-1", "a")
		b := params(t, "user-b", "key-1", "b")
		x.claim(t, a)
		x.claim(t, b) // the same key in another scope is a new key
		require.NoError(t, x.s.Complete(x.ctx, a.Scope, a.Key, a.Owner, answer()))
		require.True(t, x.get(t, b.Scope, b.Key).InProgress())
		require.NoError(t, x.s.Release(x.ctx, b.Scope, b.Key, b.Owner))
		requireAnswer(t, answer(), x.get(t, a.Scope, a.Key))
		x.notFound(t, b.Scope, b.Key)
		x.notFound(t, "user-c", "key-1")
		// Scope and key do not run into each other.
		x.claim(t, params(t, "user-ak", "ey-1", "c"))
		x.claim(t, params(t, "user-", "akey-1", "c"))
	}},

	{"expiry/an expired row is not found", func(t *testing.T, x *suite) {
		p := params(t, "user-1", "key-1", "a")
		x.claim(t, p)
		require.NoError(t, x.s.Complete(x.ctx, p.Scope, p.Key, p.Owner, answer()))
		x.h.Age(t, x.s, p.Scope, p.Key, x.s.Retention()/2)
		x.get(t, p.Scope, p.Key) // still live
		x.h.Age(t, x.s, p.Scope, p.Key, x.s.Retention()/2+time.Hour)
		x.notFound(t, p.Scope, p.Key)
		require.ErrorIs(t, x.s.Complete(x.ctx, p.Scope, p.Key, p.Owner, answer()), idem.ErrNotFound)
		require.ErrorIs(t, x.s.Release(x.ctx, p.Scope, p.Key, p.Owner), idem.ErrNotFound)
	}},

	{"expiry/a row in progress never expires", func(t *testing.T, x *suite) {
		p := params(t, "user-1", "key-1", "a")
		x.claim(t, p)
		x.expire(t, p.Scope, p.Key)
		require.Equal(t, p.Owner, x.get(t, p.Scope, p.Key).Owner, "still live")
		rec := x.lose(t, params(t, p.Scope, p.Key, "a"))
		require.Equal(t, p.Owner, rec.Owner, "never taken over")
		if x.h.Sweep != nil {
			n, err := x.h.Sweep(t, x.s)
			require.NoError(t, err)
			require.Zero(t, n, "never swept")
		}
		// Settled long after its claim: the answer lives a full retention.
		require.NoError(t, x.s.Complete(x.ctx, p.Scope, p.Key, p.Owner, answer()))
		requireAnswer(t, answer(), x.lose(t, params(t, p.Scope, p.Key, "a")))
	}},

	{"expiry/claim takes over an expired row", func(t *testing.T, x *suite) {
		for _, released := range []bool{false, true} {
			old := params(t, "user-1", "key-1", "old")
			x.claim(t, old)
			if released {
				require.NoError(t, x.s.Release(x.ctx, old.Scope, old.Key, old.Owner))
			} else {
				require.NoError(t, x.s.Complete(x.ctx, old.Scope, old.Key, old.Owner, answer()))
			}
			x.expire(t, old.Scope, old.Key)
			next := params(t, "user-1", "key-1", "new")
			rec := x.claim(t, next)
			require.Equal(t, next.Fingerprint, rec.Fingerprint, "a new intent")
			require.Equal(t, next.Owner, rec.Owner)
			require.Equal(t, next.Intent, rec.Intent)
			require.Equal(t, 1, rec.Attempt)
			require.True(t, rec.InProgress(), "no answer of the old intent")
			require.ErrorIs(t, x.s.Complete(x.ctx, old.Scope, old.Key, old.Owner, answer()), idem.ErrNotOwner)
			require.NoError(t, x.s.Complete(x.ctx, next.Scope, next.Key, next.Owner, idem.Response{Status: 200}))
			x.expire(t, next.Scope, next.Key)
		}
	}},

	{"complete/only the owner completes, once", func(t *testing.T, x *suite) {
		p := params(t, "user-1", "key-1", "a")
		require.ErrorIs(t, x.s.Complete(x.ctx, p.Scope, p.Key, p.Owner, answer()), idem.ErrNotFound)
		x.claim(t, p)
		require.ErrorIs(t, x.s.Complete(x.ctx, p.Scope, p.Key, newToken(t), answer()), idem.ErrNotOwner)
		require.True(t, x.get(t, p.Scope, p.Key).InProgress(), "nothing written")
		require.NoError(t, x.s.Complete(x.ctx, p.Scope, p.Key, p.Owner, answer()))
		requireAnswer(t, answer(), x.get(t, p.Scope, p.Key))

		require.NoError(t, x.s.Complete(x.ctx, p.Scope, p.Key, p.Owner, answer()),
			"the same answer again by its owner: a retry whose first reply was lost")
		err := x.s.Complete(x.ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 200})
		require.ErrorIs(t, err, idem.ErrCompleted, "another answer by the owner")
		err = x.s.Complete(x.ctx, p.Scope, p.Key, newToken(t), idem.Response{Status: 200})
		require.Error(t, err)
		require.True(t, errorIsAny(err, idem.ErrNotOwner, idem.ErrCompleted), "got %v", err)
		requireAnswer(t, answer(), x.get(t, p.Scope, p.Key))
	}},

	{"release/only the owner releases an in-progress row", func(t *testing.T, x *suite) {
		p := params(t, "user-1", "key-1", "a")
		require.ErrorIs(t, x.s.Release(x.ctx, p.Scope, p.Key, p.Owner), idem.ErrNotFound)
		x.claim(t, p)
		require.ErrorIs(t, x.s.Release(x.ctx, p.Scope, p.Key, newToken(t)), idem.ErrNotOwner)
		x.get(t, p.Scope, p.Key)
		require.NoError(t, x.s.Release(x.ctx, p.Scope, p.Key, p.Owner))
		x.notFound(t, p.Scope, p.Key)
		require.ErrorIs(t, x.s.Release(x.ctx, p.Scope, p.Key, p.Owner), idem.ErrNotFound, "released once")
		require.ErrorIs(t, x.s.Complete(x.ctx, p.Scope, p.Key, p.Owner, answer()), idem.ErrNotFound)
		x.claim(t, params(t, "user-1", "key-1", "a")) // the next claim wins

		q := params(t, "user-1", "key-2", "a")
		x.claim(t, q)
		require.NoError(t, x.s.Complete(x.ctx, q.Scope, q.Key, q.Owner, answer()))
		require.ErrorIs(t, x.s.Release(x.ctx, q.Scope, q.Key, q.Owner), idem.ErrCompleted, "a finished row is never released")
		requireAnswer(t, answer(), x.get(t, q.Scope, q.Key))
	}},

	{"release/keeps the intent for the next attempt", func(t *testing.T, x *suite) {
		p := params(t, "user-1", "key-1", "a")
		x.claim(t, p)
		require.NoError(t, x.s.Release(x.ctx, p.Scope, p.Key, p.Owner))

		other := params(t, p.Scope, p.Key, "b")
		rec := x.lose(t, other)
		require.Equal(t, p.Fingerprint, rec.Fingerprint, "another request under a released key finds its fingerprint")
		x.notFound(t, p.Scope, p.Key)

		retry := params(t, p.Scope, p.Key, "a")
		rec = x.claim(t, retry)
		require.Equal(t, p.Intent, rec.Intent, "the same intent")
		require.Equal(t, 2, rec.Attempt)
		require.Equal(t, retry.Owner, rec.Owner, "a new owner")
		require.True(t, rec.InProgress())
		require.False(t, rec.HoldUntil.Before(rec.CreatedAt.Add(retry.Hold)), "the new attempt's own deadline")
		require.ErrorIs(t, x.s.Complete(x.ctx, p.Scope, p.Key, p.Owner, answer()), idem.ErrNotOwner,
			"the released attempt no longer completes")
		require.ErrorIs(t, x.s.Release(x.ctx, p.Scope, p.Key, p.Owner), idem.ErrNotOwner)
		require.NoError(t, x.s.Complete(x.ctx, retry.Scope, retry.Key, retry.Owner, answer()))
		requireAnswer(t, answer(), x.lose(t, params(t, p.Scope, p.Key, "a")))
	}},

	{"get/not found", func(t *testing.T, x *suite) {
		x.notFound(t, "user-1", "key-1")
		x.claim(t, params(t, "user-1", "key-1", "a"))
		x.notFound(t, "user-1", "key-2")
		x.notFound(t, "user-2", "key-1")
	}},

	{"answers round-trip byte for byte", func(t *testing.T, x *suite) {
		answers := []idem.Response{
			answer(),
			{Status: 204}, // nil header and body
			{Status: 200, Header: http.Header{}, Body: []byte{}}, // empty
			{Status: 100},
			{Status: 499, Body: bytes.Repeat([]byte{0, 1, 2, 0xfe, 0xff}, 20000)}, // 100 KB of binary
		}
		for i, want := range answers {
			// Through Complete, read back by Get and by a losing Claim.
			c := params(t, "user-1", "complete-"+string(rune('a'+i)), "a")
			x.claim(t, c)
			require.NoError(t, x.s.Complete(x.ctx, c.Scope, c.Key, c.Owner, want))
			for _, p := range []idem.ClaimParams{c} {
				requireAnswer(t, want, x.get(t, p.Scope, p.Key))
				retry := p
				retry.Owner = newToken(t)
				requireAnswer(t, want, x.lose(t, retry))
			}
		}
	}},

	{"sweep/deletes expired rows only", func(t *testing.T, x *suite) {
		if x.h.Sweep == nil {
			t.Skip("idemtest: Harness.Sweep not set")
		}
		// a: in progress (never expires), b and c: answered, d: released;
		// a, b and d aged past the retention, c half of it.
		for i, state := range []string{"in progress", "answered", "answered", "released"} {
			p := params(t, "user-1", "key-"+string(rune('a'+i)), "a")
			x.claim(t, p)
			switch state {
			case "answered":
				require.NoError(t, x.s.Complete(x.ctx, p.Scope, p.Key, p.Owner, answer()))
			case "released":
				require.NoError(t, x.s.Release(x.ctx, p.Scope, p.Key, p.Owner))
			}
			if i == 2 {
				x.h.Age(t, x.s, p.Scope, p.Key, x.s.Retention()/2)
			} else {
				x.expire(t, p.Scope, p.Key)
			}
		}
		live := params(t, "user-1", "live", "a")
		x.claim(t, live)

		n, err := x.h.Sweep(t, x.s)
		require.NoError(t, err)
		require.EqualValues(t, 2, n)
		x.get(t, live.Scope, live.Key)
		require.True(t, x.get(t, "user-1", "key-a").InProgress())
		requireAnswer(t, answer(), x.get(t, "user-1", "key-c"))
		n, err = x.h.Sweep(t, x.s)
		require.NoError(t, err)
		require.Zero(t, n)
	}},
}

// race has 64 goroutines claim one key at once, after prepare, and checks
// that exactly one wins and every other gets the winner's row.
func race(t *testing.T, x *suite, prepare func()) {
	const n = 64
	prepare()
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		ps      [n]idem.ClaimParams
		recs    [n]idem.Record
		claimed [n]bool
		errs    [n]error
	)
	for i := range n {
		ps[i] = params(t, "user-1", "key-1", "same body")
		wg.Go(func() {
			<-start
			recs[i], claimed[i], errs[i] = x.s.Claim(x.ctx, ps[i])
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i := range n {
		require.NoError(t, errs[i])
		if claimed[i] {
			require.Equal(t, -1, winner, "two claims won")
			winner = i
		}
	}
	require.NotEqual(t, -1, winner, "no claim won")
	for i := range n {
		require.Equal(t, ps[winner].Owner, recs[i].Owner, "claim %d sees the winner's row", i)
		require.True(t, recs[i].InProgress())
	}
	require.Equal(t, ps[winner].Owner, x.get(t, "user-1", "key-1").Owner)
}

func errorIsAny(err error, targets ...error) bool {
	for _, target := range targets {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}
