package idem

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// A copy decodes to the answer the row holds: the same status, headers and
// body, with nil headers and body read back empty, as durable reads a row.
func TestLeaseAnswerRoundTrip(t *testing.T) {
	fp := Fingerprint{1, 2, 3}
	for _, a := range []Response{
		{Status: 201, Header: http.Header{"Location": {"/orders/1"}, "Set-Cookie": {"a=1", "b=2"}}, Body: []byte(`{"id":1}`)},
		{Status: 402},
		{Status: 204, Header: http.Header{"x-lower": {"kept as sent"}}, Body: []byte{}},
		{Status: 200, Body: bytes.Repeat([]byte{0, 0xff}, 100)},
	} {
		st, ok := decodeLease(encodeAnswerLease(fp, a))
		require.True(t, ok)
		require.Equal(t, leaseAnswer, st.kind)
		require.Equal(t, fp, st.fp)
		require.Equal(t, a.Status, st.resp.Status)
		require.NotNil(t, st.resp.Header)
		require.NotNil(t, st.resp.Body)
		require.True(t, st.resp.Equal(a))
	}

	big := Response{Status: 200, Body: make([]byte, maxLeaseAnswer)}
	st, ok := decodeLease(encodeAnswerLease(fp, big))
	require.True(t, ok)
	require.Equal(t, leaseDone, st.kind, "an answer over the cap leaves only a marker")
	require.Equal(t, fp, st.fp)

	for _, kind := range []byte{leaseClaiming, leaseRunning, leasePending, leaseDone} {
		st, ok := decodeLease(encodeLease(kind, fp))
		require.True(t, ok)
		require.Equal(t, kind, st.kind)
		require.Equal(t, fp, st.fp)
	}
	for _, b := range [][]byte{nil, []byte("a bare owner token"), append(encodeLease(leaseRunning, fp), 'x'), encodeLease('z', fp)} {
		_, ok := decodeLease(b)
		require.False(t, ok, "%q is not a state this version knows", b)
	}
}

// No bytes in Redis can make the guard panic or replay a malformed answer:
// anything decodeLease accepts as an answer is a storable one.
func FuzzLeaseState(f *testing.F) {
	fp := Fingerprint{9}
	f.Add(encodeAnswerLease(fp, Response{Status: 201, Header: http.Header{"Location": {"/o/1"}}, Body: []byte("x")}))
	f.Add(encodeLease(leaseRunning, fp))
	f.Add([]byte("a"))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, ok := decodeLease(b)
		if !ok || st.kind != leaseAnswer {
			return
		}
		if st.resp.Status < 100 || st.resp.Status > 599 || st.resp.Header == nil || st.resp.Body == nil {
			t.Fatalf("decoded an unusable answer: %+v", st.resp)
		}
		again, ok := decodeLease(encodeAnswerLease(st.fp, st.resp))
		if len(b) <= maxLeaseAnswer && (!ok || !again.resp.Equal(st.resp)) {
			t.Fatalf("re-encoding changed the answer: %+v -> %+v", st.resp, again.resp)
		}
	})
}
