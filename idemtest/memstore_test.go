package idemtest_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/idemtest"
)

// TestMemStoreConformance runs the idem.Store conformance suite against the
// in-memory store.
func TestMemStoreConformance(t *testing.T) {
	idemtest.RunStoreSuite(t, idemtest.Harness{
		New: func(t *testing.T) idem.Store { return idemtest.NewMemStore(nil) },
		Age: func(t *testing.T, s idem.Store, scope, key string, by time.Duration) {
			t.Helper()
			require.True(t, s.(*idemtest.MemStore).Age(scope, key, by), "a row to age")
		},
		Sweep: func(t *testing.T, s idem.Store) (int64, error) {
			return s.(*idemtest.MemStore).Sweep(t.Context())
		},
	})
}

func token(t *testing.T) idem.Token {
	t.Helper()
	var tok idem.Token
	_, err := rand.Read(tok[:])
	require.NoError(t, err)
	return tok
}

func claimParams(t *testing.T, scope, key, body string) idem.ClaimParams {
	return idem.ClaimParams{Scope: scope, Key: key, Fingerprint: sha256.Sum256([]byte(body)), Owner: token(t)}
}

// clock is a settable clock for MemStoreConfig.Now.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestMemStoreDefaults(t *testing.T) {
	s := idemtest.NewMemStore(nil)
	require.Equal(t, durable.DefaultRetention, s.Retention())
	before := time.Now().Add(-time.Millisecond)
	rec, claimed, err := s.Claim(t.Context(), claimParams(t, "u", "k", "a"))
	require.NoError(t, err)
	require.True(t, claimed)
	require.WithinRange(t, rec.CreatedAt, before, time.Now().Add(time.Millisecond), "the wall clock by default")
	require.Equal(t, rec.CreatedAt, rec.CreatedAt.Truncate(time.Microsecond), "microsecond precision, as in PostgreSQL")

	g, err := idem.New(s, &idem.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err, "a Guard accepts the default retention")
	require.NotNil(t, g)
}

func TestMemStoreClock(t *testing.T) {
	c := &clock{now: time.Date(2026, 1, 2, 3, 4, 5, 6789, time.UTC)}
	s := idemtest.NewMemStore(&idemtest.MemStoreConfig{Now: c.Now})
	ctx := t.Context()
	p := claimParams(t, "u", "k", "a")
	rec, claimed, err := s.Claim(ctx, p)
	require.NoError(t, err)
	require.True(t, claimed)
	require.Equal(t, time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC), rec.CreatedAt)

	c.Advance(time.Minute)
	require.NoError(t, s.Complete(ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 201}))
	rec, err = s.Get(ctx, p.Scope, p.Key)
	require.NoError(t, err)
	require.Equal(t, time.Date(2026, 1, 2, 3, 5, 5, 6000, time.UTC), rec.CompletedAt)

	c.Advance(s.Retention())
	_, err = s.Get(ctx, p.Scope, p.Key)
	require.NoError(t, err, "live while answered at most Retention ago")
	c.Advance(time.Microsecond)
	_, err = s.Get(ctx, p.Scope, p.Key)
	require.ErrorIs(t, err, idem.ErrNotFound, "expired")

	next := claimParams(t, "u", "k", "b")
	rec, claimed, err = s.Claim(ctx, next)
	require.NoError(t, err)
	require.True(t, claimed, "an expired key is a new intent")
	require.Equal(t, next.Fingerprint, rec.Fingerprint)
	require.True(t, rec.CompletedAt.IsZero())
	require.Equal(t, c.Now().Truncate(time.Microsecond), rec.CreatedAt)
}

func TestMemStoreAge(t *testing.T) {
	s := idemtest.NewMemStore(nil)
	ctx := t.Context()
	require.False(t, s.Age("u", "k", time.Hour), "no row")
	p := claimParams(t, "u", "k", "a")
	rec, _, err := s.Claim(ctx, p)
	require.NoError(t, err)
	require.True(t, s.Age("u", "k", time.Hour))
	got, err := s.Get(ctx, "u", "k")
	require.NoError(t, err)
	require.Equal(t, rec.CreatedAt.Add(-time.Hour), got.CreatedAt)
	require.True(t, s.Age("u", "k", s.Retention()))
	_, err = s.Get(ctx, "u", "k")
	require.NoError(t, err, "a row in progress never expires")
	require.NoError(t, s.Complete(ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 200}))
	require.True(t, s.Age("u", "k", s.Retention()+time.Hour))
	_, err = s.Get(ctx, "u", "k")
	require.ErrorIs(t, err, idem.ErrNotFound)
	require.True(t, s.Age("u", "k", -2*time.Hour), "an expired row can be made younger")
	_, err = s.Get(ctx, "u", "k")
	require.NoError(t, err)
}

func TestMemStoreInvalid(t *testing.T) {
	s := idemtest.NewMemStore(nil)
	ctx := t.Context()
	owner := token(t)
	calls := map[string]func(scope, key string) error{
		"claim": func(scope, key string) error {
			_, _, err := s.Claim(ctx, idem.ClaimParams{Scope: scope, Key: key, Owner: owner})
			return err
		},
		"get": func(scope, key string) error {
			_, err := s.Get(ctx, scope, key)
			return err
		},
		"complete": func(scope, key string) error { return s.Complete(ctx, scope, key, owner, idem.Response{Status: 200}) },
		"release":  func(scope, key string) error { return s.Release(ctx, scope, key, owner) },
	}
	for name, call := range calls {
		for _, bad := range [][2]string{{"u", "k\x00"}, {"u\x00", "k"}, {"u", "k\xff"}, {"\xc3", "k"}} {
			require.ErrorIs(t, call(bad[0], bad[1]), idem.ErrInvalid, "%s %q", name, bad)
		}
	}
	_, _, err := s.Claim(ctx, idem.ClaimParams{Scope: "u", Key: "k"})
	require.ErrorIs(t, err, idem.ErrInvalid, "zero owner")

	p := claimParams(t, "u", "k", "a")
	_, _, err = s.Claim(ctx, p)
	require.NoError(t, err)
	for name, a := range map[string]idem.Response{
		"status 99":        {Status: 99},
		"status 600":       {Status: 600},
		"NUL in a value":   {Status: 200, Header: http.Header{"X-Bad": {"a\x00b"}}},
		"NUL in a name":    {Status: 200, Header: http.Header{"X-\x00": {"a"}}},
		"no status at all": {},
	} {
		require.ErrorIs(t, s.Complete(ctx, p.Scope, p.Key, p.Owner, a), idem.ErrInvalid, name)
	}
	rec, err := s.Get(ctx, p.Scope, p.Key)
	require.NoError(t, err)
	require.True(t, rec.InProgress(), "nothing written")
}

func TestMemStoreCopies(t *testing.T) {
	s := idemtest.NewMemStore(nil)
	ctx := t.Context()
	p := claimParams(t, "u", "k", "a")
	_, _, err := s.Claim(ctx, p)
	require.NoError(t, err)
	a := idem.Response{Status: 201, Header: http.Header{"Location": {"/orders/1"}}, Body: []byte("paid")}
	require.NoError(t, s.Complete(ctx, p.Scope, p.Key, p.Owner, a))

	// The caller's answer, changed after Complete.
	a.Header["Location"][0] = "/orders/2"
	a.Header.Set("X-Late", "1")
	a.Body[0] = 'X'
	// A record read back, changed by its reader.
	rec, err := s.Get(ctx, p.Scope, p.Key)
	require.NoError(t, err)
	rec.Answer.Header.Set("Location", "/orders/3")
	rec.Answer.Body[0] = 'Y'

	rec, err = s.Get(ctx, p.Scope, p.Key)
	require.NoError(t, err)
	require.Equal(t, http.Header{"Location": {"/orders/1"}}, rec.Answer.Header)
	require.Equal(t, []byte("paid"), rec.Answer.Body)
}

func TestMemStoreSweep(t *testing.T) {
	s := idemtest.NewMemStore(nil)
	ctx, cancel := context.WithCancel(t.Context())
	p := claimParams(t, "u", "k", "a")
	_, _, err := s.Claim(ctx, p)
	require.NoError(t, err)
	require.NoError(t, s.Complete(ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 200}))
	require.True(t, s.Age("u", "k", 2*s.Retention()))
	cancel()
	n, err := s.Sweep(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.Zero(t, n)
	n, err = s.Sweep(t.Context())
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.False(t, s.Age("u", "k", 0), "the row is gone")
}

// A handler that stores its answer with idem.Complete runs over a MemStore:
// the answer it completed is the one Do returns and every retry replays,
// whatever the work returned after it.
func TestMemStoreJoinsComplete(t *testing.T) {
	g, err := idem.New(idemtest.NewMemStore(nil), &idem.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	req := idem.Request{Scope: "u", Key: "k", Fingerprint: idem.HashParts([]byte("a"))}
	completed := idem.Response{Status: 201, Body: []byte("order 1")}
	var runs int
	work := func(ctx context.Context) (idem.Response, error) {
		runs++
		if err := idem.Complete(ctx, nil, completed); err != nil {
			return idem.Response{}, err
		}
		return idem.Response{Status: 200, Body: []byte("something else")}, nil
	}
	for i, want := range []idem.Outcome{idem.OutcomeExecuted, idem.OutcomeReplayed} {
		resp, out, err := g.Do(t.Context(), req, work)
		require.NoError(t, err, "call %d", i)
		require.Equal(t, want, out, "call %d", i)
		require.True(t, resp.Equal(completed), "call %d: the completed answer, got %d %q", i, resp.Status, resp.Body)
	}
	require.Equal(t, 1, runs)
}
