package idem

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestAnswerCacheLRUAndExpiry(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := newAnswerCache(2, time.Minute)
	c.now = func() time.Time { return now }
	r := func(k string) Request { return Request{Scope: "u", Key: k, Fingerprint: Fingerprint{1}} }
	resp := Response{Status: 201, Header: http.Header{"Location": {"/o/1"}}, Body: []byte("x")}

	c.put(r("a"), resp, time.Time{})
	c.put(r("b"), resp, time.Time{})
	_, ok := c.get(r("a")) // a becomes most recent
	require.True(t, ok)
	c.put(r("c"), resp, time.Time{}) // evicts b
	_, ok = c.get(r("b"))
	require.False(t, ok)
	_, ok = c.get(r("a"))
	require.True(t, ok)
	require.Equal(t, 2, c.len())

	// TTL.
	now = now.Add(61 * time.Second)
	_, ok = c.get(r("a"))
	require.False(t, ok)

	// The store's expiry wins when earlier than the TTL; a key already past
	// it is not cached at all.
	c.put(r("d"), resp, now.Add(10*time.Second))
	now = now.Add(11 * time.Second)
	_, ok = c.get(r("d"))
	require.False(t, ok)
	c.put(r("e"), resp, now.Add(-time.Second))
	_, ok = c.get(r("e"))
	require.False(t, ok)

	// Scope and key are joined unambiguously.
	c.put(Request{Scope: "ab", Key: "c", Fingerprint: Fingerprint{1}}, resp, time.Time{})
	_, ok = c.get(Request{Scope: "a", Key: "bc", Fingerprint: Fingerprint{1}})
	require.False(t, ok)
}

func TestAnswerCacheBounded(t *testing.T) {
	c := newAnswerCache(100, time.Minute)
	for i := range 1000 {
		c.put(Request{Scope: "u", Key: fmt.Sprint(i), Fingerprint: Fingerprint{1}}, Response{Status: 200}, time.Time{})
	}
	require.Equal(t, 100, c.len())
	_, ok := c.get(Request{Scope: "u", Key: "999"})
	require.True(t, ok)
	_, ok = c.get(Request{Scope: "u", Key: "0"})
	require.False(t, ok)
}

func TestCloneResponseIsDeep(t *testing.T) {
	a := Response{Status: 201, Header: http.Header{"Location": {"/a"}}, Body: []byte("body")}
	b := cloneResponse(a)
	b.Header.Set("Location", "/b")
	b.Body[0] = 'X'
	require.Equal(t, "/a", a.Header.Get("Location"))
	require.Equal(t, "body", string(a.Body))
}

// answeredStore returns one answered row, read with ttl left, whose
// created_at is on a database clock far from the host's.
type answeredStore struct {
	rec Record
}

func (s answeredStore) Claim(context.Context, ClaimParams) (Record, bool, error) {
	return s.rec, false, nil
}
func (s answeredStore) Get(context.Context, string, string) (Record, error) {
	return s.rec, nil
}
func (answeredStore) Complete(context.Context, string, string, Token, Response) error {
	return nil
}
func (answeredStore) Release(context.Context, string, string, Token) error { return nil }
func (answeredStore) Retention() time.Duration                             { return 24 * time.Hour }

// A cached answer leaves the cache by the key's remaining life as the
// database counted it, on the host's monotonic clock: a database clock two
// minutes ahead of the host (or behind it) changes nothing.
func TestCacheCountsTheKeysLifeFromTheDatabase(t *testing.T) {
	for _, skew := range []time.Duration{2 * time.Minute, -2 * time.Minute} {
		t.Run(fmt.Sprint("db clock ", skew), func(t *testing.T) {
			fp := Fingerprint{7}
			rec := Record{
				Scope: "u", Key: "k", Fingerprint: fp,
				Answer: &Response{Status: 201, Header: http.Header{}, Body: []byte("x")},
				// Thirty seconds of the 24 h retention left (less than the
				// cache's minute), on a database clock that is skew ahead
				// of the host's.
				CreatedAt: time.Now().Add(skew).Add(-24*time.Hour + 30*time.Second),
				TTL:       30 * time.Second,
			}
			g, err := New(answeredStore{rec}, &Config{CacheSize: 8})
			require.NoError(t, err)
			rq := Request{Scope: "u", Key: "k", Fingerprint: fp}
			_, out, err := g.Do(context.Background(), rq, func(context.Context) (Response, error) {
				return Response{}, errors.New("must not run")
			})
			require.NoError(t, err)
			require.Equal(t, OutcomeReplayed, out)
			e, ok := g.cache.get(rq)
			require.True(t, ok)
			require.False(t, e.expires.After(time.Now().Add(30*time.Second)),
				"the entry outlives the key's remaining 30s by %v", time.Until(e.expires)-30*time.Second)
		})
	}
}
