package idem

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Retry-After's jitter: whole seconds from the hint (rounded up, at least
// 1s) to the hint plus max(1s, a fifth of it), never outside; both ends are
// drawn; a hint that is not positive stays as it is (no Retry-After).
func TestJitter(t *testing.T) {
	for _, tc := range []struct {
		hint     time.Duration
		min, max int
	}{
		{time.Second, 1, 2},
		{1500 * time.Millisecond, 2, 3},
		{2 * time.Second, 2, 3},
		{30 * time.Second, 30, 36},
		{100 * time.Millisecond, 1, 2},
	} {
		seen := map[int]bool{}
		for range 1000 {
			d := jitter(tc.hint)
			require.Zero(t, d%time.Second, "whole seconds")
			s := int(d / time.Second)
			require.GreaterOrEqual(t, s, tc.min, "hint %v", tc.hint)
			require.LessOrEqual(t, s, tc.max, "hint %v", tc.hint)
			seen[s] = true
		}
		require.True(t, seen[tc.min] && seen[tc.max], "hint %v: both ends drawn: %v", tc.hint, seen)
	}
}

// spyBody delivers its chunks one Read at a time, then fails, and records
// the largest buffer it was handed.
type spyBody struct {
	chunks  []string
	largest int
	arrived int
}

func (b *spyBody) Read(p []byte) (int, error) {
	b.largest = max(b.largest, b.arrived+len(p))
	if len(b.chunks) == 0 {
		return 0, errors.New("connection reset")
	}
	n := copy(p, b.chunks[0])
	b.chunks[0] = b.chunks[0][n:]
	if b.chunks[0] == "" {
		b.chunks = b.chunks[1:]
	}
	b.arrived += n
	return n, nil
}

func (*spyBody) Close() error { return nil }

// The body buffer grows with the bytes that arrive, not with the declared
// Content-Length: a request declaring 1 MiB that sends 10 bytes is never
// handed more than firstBodyBuffer; one that sends 100 KiB holds at most
// twice what arrived.
func TestReadBodyGrowsWithArrivingBytes(t *testing.T) {
	m := &middleware{maxBody: DefaultMaxBody}
	for _, tc := range []struct {
		name    string
		chunks  []string
		largest int
	}{
		{"headers and 10 bytes", []string{"0123456789"}, firstBodyBuffer},
		{"100 KiB", []string{strings.Repeat("x", 50<<10), strings.Repeat("y", 50<<10)}, 2 * (100 << 10)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := &spyBody{chunks: tc.chunks}
			r := httptest.NewRequest(http.MethodPost, "/orders", body)
			r.ContentLength = DefaultMaxBody
			_, status := m.readBody(r)
			require.Equal(t, http.StatusBadRequest, status, "the body was cut short")
			require.LessOrEqual(t, body.largest, tc.largest)
		})
	}

	// A body that arrives whole is read whole, in one buffer of its size
	// when it declared its length.
	for _, n := range []int{0, 1, 511, 4 << 10, 100 << 10, DefaultMaxBody} {
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(strings.Repeat("a", n)))
		got, status := m.readBody(r)
		require.Zero(t, status, "n=%d", n)
		require.Len(t, got, n)
		if n > 0 && n < firstBodyBuffer {
			require.Equal(t, n+1, cap(got), "one buffer of the declared size")
		}
		r = httptest.NewRequest(http.MethodPost, "/orders", io.MultiReader(strings.NewReader(strings.Repeat("a", n))))
		r.ContentLength = -1 // chunked
		got, status = m.readBody(r)
		require.Zero(t, status, "chunked n=%d", n)
		require.Len(t, got, n)
	}
	r := httptest.NewRequest(http.MethodPost, "/orders", io.MultiReader(strings.NewReader(strings.Repeat("a", DefaultMaxBody+1))))
	r.ContentLength = -1
	_, status := m.readBody(r)
	require.Equal(t, http.StatusRequestEntityTooLarge, status)
}
