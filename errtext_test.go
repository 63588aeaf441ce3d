package idem_test

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/idemtest"
	"github.com/idemguard/idem/lock"
	"github.com/idemguard/idem/reconcile"
)

// failingStore fails every claim with a driver-like error; with cancel set,
// it cancels the caller's context first, as a client that hangs up mid-call.
type failingStore struct {
	*idemtest.MemStore
	cancel context.CancelFunc
}

func (s failingStore) Claim(context.Context, idem.ClaimParams) (idem.Record, bool, error) {
	if s.cancel != nil {
		s.cancel()
	}
	return idem.Record{}, false, errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
}

// requireOneLine checks that an error reads as one log line that names each
// layer once: no newline (a wrapped errors.Join), no package of this module
// named twice ("idem: claim: idem: store unavailable"), and none of the
// segments the library writes (those before the driver's own text) said
// twice ("durable: claim: ... claim").
func requireOneLine(t *testing.T, name string, err error) {
	t.Helper()
	require.Error(t, err, name)
	text := err.Error()
	require.NotContains(t, text, "\n", "%s: %q", name, text)
	parts := strings.Split(text, ": ")
	seen := map[string]bool{}
	for _, p := range parts {
		if !libSegment.MatchString(p) {
			break // the driver's text, which may repeat its own words
		}
		require.False(t, seen[p], "%s: %q said twice in %q", name, p, text)
		seen[p] = true
	}
	for pkg := range modulePackages {
		require.LessOrEqual(t, strings.Count(" "+text, " "+pkg+": "), 1, "%s: package %s named twice in %q", name, pkg, text)
	}
}

// modulePackages are the prefixes this module's errors start with.
var modulePackages = map[string]bool{"idem": true, "durable": true, "lock": true, "reconcile": true,
	"pgidem": true, "grpcidem": true, "idemtest": true, "idemclient": true}

// libSegment is a segment the library writes: a package name or an
// operation, a word or a few.
var libSegment = regexp.MustCompile(`^[a-z][a-z ]{0,40}$`)

// TestErrorsReadAsOneLine walks representative errors of the guard, its
// store calls (in memory and over an unreachable PostgreSQL), the lease, the
// key parser and the configs.
func TestErrorsReadAsOneLine(t *testing.T) {
	ctx := t.Context()
	mem := idemtest.NewMemStore(nil)
	req := idem.Request{Scope: "u", Key: "k", Fingerprint: idem.HashParts([]byte("x"))}
	work := func(context.Context) (idem.Response, error) { return idem.Response{Status: 201}, nil }

	down, err := idem.New(failingStore{MemStore: mem}, nil)
	require.NoError(t, err)
	_, _, err = down.Do(ctx, req, work)
	require.ErrorIs(t, err, idem.ErrUnavailable)
	requireOneLine(t, "store unavailable", err)

	cctx, cancel := context.WithCancel(ctx)
	hungUp, err := idem.New(failingStore{MemStore: mem, cancel: cancel}, nil)
	require.NoError(t, err)
	_, _, err = hungUp.Do(cctx, req, work)
	require.ErrorIs(t, err, context.Canceled)
	requireOneLine(t, "caller gone during the claim", err)

	g, err := idem.New(mem, nil)
	require.NoError(t, err)
	requireOneLine(t, "settle", g.Settle(ctx, "u", "nobody", idem.Token{1}, idem.Response{Status: 200}))
	requireOneLine(t, "release", g.Release(ctx, "u", "nobody", idem.Token{1}))
	_, _, err = g.Do(ctx, idem.Request{Key: "k", Fingerprint: req.Fingerprint}, work)
	requireOneLine(t, "invalid request", err)
	_, err = idem.ParseKey([]string{"a, b"})
	requireOneLine(t, "invalid key", err)
	_, err = idem.New(mem, &idem.Config{WorkTimeout: -1})
	requireOneLine(t, "config", err)

	// PostgreSQL down: durable's error inside the guard's.
	dead, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:1/idem?connect_timeout=1")
	require.NoError(t, err)
	t.Cleanup(dead.Close)
	pg, err := durable.New(dead, nil)
	require.NoError(t, err)
	pgGuard, err := idem.New(pg, nil)
	require.NoError(t, err)
	_, _, err = pgGuard.Do(ctx, req, work)
	require.ErrorIs(t, err, idem.ErrUnavailable)
	requireOneLine(t, "postgres down", err)
	requireOneLine(t, "postgres down, settle", pgGuard.Settle(ctx, "u", "k", idem.Token{1}, idem.Response{Status: 200}))
	requireOneLine(t, "postgres down, release", pgGuard.Release(ctx, "u", "k", idem.Token{1}))
	requireOneLine(t, "durable config", (&durable.Config{Schema: "Bad-Name"}).Validate())
	_, err = reconcile.New(nil, pg, nil, nil)
	requireOneLine(t, "reconcile config", err)

	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	locker, err := lock.New(rdb, nil)
	require.NoError(t, err)
	mr.SetError("LOADING Redis is loading the dataset in memory")
	_, _, err = locker.Obtain(ctx, "u", "k", nil)
	require.ErrorIs(t, err, lock.ErrUnavailable)
	requireOneLine(t, "lock unavailable", err)
	mr.SetError("")

	hybrid, err := idem.New(mem, &idem.Config{Lock: locker})
	require.NoError(t, err)
	gone, cancel := context.WithCancel(ctx)
	cancel()
	_, _, err = hybrid.Do(gone, req, work)
	require.ErrorIs(t, err, context.Canceled)
	requireOneLine(t, "caller gone during the lease", err)
}
