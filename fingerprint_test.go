package idem_test

import (
	"crypto/sha256"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
)

// Requests that a naive concatenation would confuse get different
// fingerprints; equal requests get equal ones.
func TestHashRequestDistinguishes(t *testing.T) {
	type r struct{ method, target, body string }
	cases := []r{
		{"POST", "/orders", ""},
		{"POST", "/orders", "{}"},
		{"POST", "/orders/", "{}"},
		{"POST", "/orders?x=1", "{}"},
		{"POST", "/orders?", "{}"},
		{"PATCH", "/orders", "{}"},
		{"POST", "/ordersa", "b"},
		{"POST", "/orders", "ab"},
		{"POS", "T/orders", "ab"},
		{"POST/", "orders", "ab"},
		{"", "", ""},
		{"POST", "/orders", "{\"a\":1}"},
		{"POST", "/orders", "{\"a\": 1}"},
	}
	seen := map[idem.Fingerprint]r{}
	for _, c := range cases {
		fp := idem.HashRequest(c.method, c.target, []byte(c.body))
		prev, dup := seen[fp]
		require.Falsef(t, dup, "%+v and %+v share a fingerprint", c, prev)
		seen[fp] = c
		require.Equal(t, fp, idem.HashRequest(c.method, c.target, []byte(c.body)), "stable")
		require.Equal(t, fp, idem.HashParts([]byte(c.method), []byte(c.target), []byte(c.body)),
			"HashRequest is HashParts over its three parts")
	}
}

func TestHashPartsDistinguishesShapes(t *testing.T) {
	cases := [][][]byte{
		{},
		{nil},
		{[]byte("")},
		{[]byte(""), []byte("")},
		{[]byte("a")},
		{[]byte("a"), nil},
		{[]byte("ab"), []byte("c")},
		{[]byte("a"), []byte("bc")},
		{[]byte("abc")},
	}
	seen := map[idem.Fingerprint]int{}
	for i, c := range cases {
		fp := idem.HashParts(c...)
		if j, dup := seen[fp]; dup {
			// nil and empty are the same bytes: the only allowed equality.
			require.Truef(t, (i == 2 && j == 1), "cases %d and %d collide", j, i)
			continue
		}
		seen[fp] = i
	}
}

// The encoding is the documented one, so other implementations can
// reproduce a fingerprint.
func TestHashRequestEncoding(t *testing.T) {
	var buf []byte
	buf = append(buf, "idem/fingerprint/v1"...)
	buf = binary.BigEndian.AppendUint64(buf, 3)
	for _, p := range []string{"POST", "/orders?a=1", `{"x":1}`} {
		buf = binary.BigEndian.AppendUint64(buf, uint64(len(p)))
		buf = append(buf, p...)
	}
	want := sha256.Sum256(buf)
	require.Equal(t, idem.Fingerprint(want), idem.HashRequest("POST", "/orders?a=1", []byte(`{"x":1}`)))
}
