package idem

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
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
		{Status: 200, Header: http.Header{"Empty": {}, "Nil": nil, "Blank": {""}, "Odd": {"<&>", "é", "\x00"}}},
	} {
		st, ok := decodeLease(encodeAnswerLease(fp, a))
		require.True(t, ok)
		require.Equal(t, leaseAnswer, st.kind)
		require.Equal(t, fp, st.fp)
		require.Equal(t, a.Status, st.resp.Status)
		require.NotNil(t, st.resp.Body)
		require.True(t, st.resp.Equal(a))
		require.Equal(t, rowHeader(t, a.Header), st.resp.Header, "the copy's headers are the row's, nil and empty lists alike")
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

// rowHeader is h as durable reads it back from a row: through JSON, with a
// JSON null read as an empty header.
func rowHeader(t testing.TB, h http.Header) http.Header {
	if h == nil {
		h = http.Header{}
	}
	b, err := json.Marshal(h)
	require.NoError(t, err)
	out := http.Header{}
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

// Whatever the names and values (UTF-8, as durable stores only those), a
// copy's headers are exactly the ones a replay from the row has.
func FuzzLeaseCopyIsTheRow(f *testing.F) {
	f.Add("Location\x00Set-Cookie", "/o/1\x00a=1\x01b=2", uint8(0))
	f.Add("", "", uint8(1))
	f.Add("X\x00Y\x00X", "\x01\x00<&>", uint8(3))
	f.Fuzz(func(t *testing.T, names, values string, nils uint8) {
		h := http.Header{}
		vs := strings.Split(strings.ToValidUTF8(values, "?"), "\x00")
		for i, name := range strings.Split(strings.ToValidUTF8(names, "?"), "\x00") {
			switch {
			case nils&(1<<(i%8)) != 0:
				h[name] = nil
			case i < len(vs):
				h[name] = strings.Split(vs[i], "\x01")
			default:
				h[name] = []string{}
			}
		}
		a := Response{Status: 201, Header: h, Body: []byte(values)}
		st, ok := decodeLease(encodeAnswerLease(Fingerprint{}, a))
		if !ok {
			t.Fatalf("a copy of %+v did not decode", a)
		}
		if st.kind == leaseDone {
			return
		}
		require.Equal(t, rowHeader(t, h), st.resp.Header)
		require.Equal(t, a.Body, st.resp.Body)
	})
}
