package idem

import (
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
