package idem_test

// Fuzz targets: the key parser, the fingerprint encoding and the capture and
// replay round trip through the middleware. `go test` runs their seed corpus
// (f.Add and testdata/fuzz/); .ci/fuzz runs each with -fuzz for a while.

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/idemtest"
)

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{
		"8e03978e-40d5-43e8-bc93-6894a57f9324", `"8e03978e"`, `"a \"b\" \\ c"`, "", " ", `""`,
		`"unterminated`, `"x"y`, `"x";p=1`, "a,b", `a"b`, "a\tb", "\x00", "\x7f", "caf\xc3\xa9",
		"\xff", strings.Repeat("k", 255), strings.Repeat("k", 256), `"` + strings.Repeat("k", 255) + `"`,
		`"\`, `"\x"`, " \tk\t ",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		key, err := idem.ParseKey([]string{v})
		if err != nil {
			require.ErrorIs(t, err, idem.ErrKeyInvalid, "%q", v)
			var ke *idem.KeyError
			require.ErrorAs(t, err, &ke)
			require.NotEmpty(t, ke.Reason)
			require.True(t, utf8.ValidString(ke.Reason), "the reason is shown to clients")
			if len(v) > 16 {
				require.NotContains(t, ke.Reason, v, "the reason does not echo the input")
			}
		} else {
			require.NotEmpty(t, key)
			require.LessOrEqual(t, len(key), idem.MaxKeyLen)
			for i := 0; i < len(key); i++ {
				require.True(t, key[i] >= 0x20 && key[i] <= 0x7e, "printable ASCII: %q", key)
			}
			// The quoted form of any accepted key parses to it.
			quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
			got, err := idem.ParseKey([]string{quoted})
			require.NoError(t, err, "%q", quoted)
			require.Equal(t, key, got)
			// A simple key (a token) parses the same bare and quoted.
			if !strings.ContainsAny(key, ` ",`) {
				got, err := idem.ParseKey([]string{key})
				require.NoError(t, err, "%q", key)
				require.Equal(t, key, got)
			}
		}
		// Surrounding spaces and tabs never matter.
		key2, err2 := idem.ParseKey([]string{" \t" + v + "\t "})
		require.Equal(t, err == nil, err2 == nil, "%q", v)
		require.Equal(t, key, key2)
		// Two fields are never a key.
		_, err = idem.ParseKey([]string{v, v})
		require.ErrorIs(t, err, idem.ErrKeyInvalid)
	})
}

func FuzzHashRequest(f *testing.F) {
	f.Add([]byte("POST/orders{}"), uint16(4), uint16(11), uint16(4), uint16(12))
	f.Add([]byte("POST/ab"), uint16(4), uint16(6), uint16(4), uint16(7))
	f.Add([]byte("abc"), uint16(0), uint16(0), uint16(0), uint16(3))
	f.Add([]byte(""), uint16(0), uint16(0), uint16(0), uint16(0))
	f.Add([]byte("PATCH/x?y=1\x00\x00\x00\x00\x00\x00\x00\x03abc"), uint16(5), uint16(11), uint16(5), uint16(11))
	f.Fuzz(func(t *testing.T, data []byte, i, j, k, l uint16) {
		// Two triples cut from the same bytes: the same concatenation, so
		// only an unambiguous encoding tells them apart.
		split := func(a, b uint16) (string, string, []byte) {
			n := len(data) + 1
			x, y := int(a)%n, int(b)%n
			if x > y {
				x, y = y, x
			}
			return string(data[:x]), string(data[x:y]), data[y:]
		}
		m1, t1, b1 := split(i, j)
		m2, t2, b2 := split(k, l)
		fp1, fp2 := idem.HashRequest(m1, t1, b1), idem.HashRequest(m2, t2, b2)
		same := m1 == m2 && t1 == t2 && bytes.Equal(b1, b2)
		require.Equal(t, same, fp1 == fp2, "(%q,%q,%q) vs (%q,%q,%q)", m1, t1, b1, m2, t2, b2)
		require.NotEqual(t, idem.Fingerprint{}, fp1)

		// HashRequest is HashParts of the three parts, and is deterministic.
		require.Equal(t, fp1, idem.HashParts([]byte(m1), []byte(t1), b1))
		require.Equal(t, fp1, idem.HashRequest(m1, t1, bytes.Clone(b1)))
		// A nil body is an empty body.
		if len(b1) == 0 {
			require.Equal(t, fp1, idem.HashRequest(m1, t1, nil))
		}
		// The number of parts is encoded: a trailing empty part differs.
		require.NotEqual(t, idem.HashParts([]byte(m1), []byte(t1)), idem.HashParts([]byte(m1), []byte(t1), nil))
	})
}

// neverReplayed are headers the fuzzed handler sets that no replay may carry.
var neverReplayed = []string{"Set-Cookie", "Authorization", "X-Other", "Connection", "Trailer"}

func FuzzReplayRoundTrip(f *testing.F) {
	f.Add(uint16(1), "/orders/1", "application/json", `"v1"`, "secret", []byte(`{"id":1}`), uint8(1))
	f.Add(uint16(202), "", "", "", "", []byte("<html>sniffed</html>"), uint8(3))
	f.Add(uint16(4), "/a\r\nSet-Cookie: x=1", "text/plain\x00", "W/\"x\"", "o", []byte{}, uint8(0))
	f.Add(uint16(104), "", "", "", "", []byte("not modified"), uint8(1))
	f.Add(uint16(229), "", "", "", "", []byte("slow down"), uint8(1))
	f.Add(uint16(302), "", "", "", "", []byte("boom"), uint8(2))
	f.Add(uint16(202), "/ünïcode", "text/plain; charset=utf-8", "", "", bytes.Repeat([]byte{0xff, 0}, 100), uint8(7))
	g, err := idem.New(idemtest.NewMemStore(nil), &idem.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(f, err)
	var n atomic.Int64
	scope := func(*http.Request) (string, bool) { return "fuzzer", true }
	f.Fuzz(func(t *testing.T, status uint16, location, ctype, etag, other string, body []byte, chunks uint8) {
		code := 200 + int(status)%400 // 200..599: the statuses a handler answers with
		var calls int
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls++
			hd := w.Header()
			for name, v := range map[string]string{"Location": location, "Content-Type": ctype, "ETag": etag} {
				if v != "" {
					hd[name] = []string{v}
				}
			}
			for _, name := range neverReplayed {
				hd[name] = []string{other}
			}
			w.WriteHeader(code)
			parts := int(chunks%8) + 1
			for i := range parts {
				_, _ = w.Write(body[len(body)*i/parts : len(body)*(i+1)/parts])
			}
		})
		mw := g.Middleware(scope, nil)(h)
		key := fmt.Sprintf("fuzz-%d", n.Add(1))
		send := func() *http.Response {
			r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader("same"))
			r.Header.Set(idem.HeaderKey, key)
			w := httptest.NewRecorder()
			mw.ServeHTTP(w, r)
			return w.Result()
		}
		first := send()
		firstBody, _ := io.ReadAll(first.Body)
		require.Equal(t, code, first.StatusCode, "the first answer goes through")
		second := send()
		secondBody, _ := io.ReadAll(second.Body)
		switch {
		case code == http.StatusTooManyRequests:
			require.Equal(t, 2, calls, "a 429 releases the key")
			return
		case code >= 500:
			require.Equal(t, http.StatusConflict, second.StatusCode, "a 5xx leaves the key in progress")
			require.Equal(t, 1, calls)
			return
		}
		require.Equal(t, 1, calls)
		require.Equal(t, "true", second.Header.Get(idem.HeaderReplayed))
		require.Equal(t, code, second.StatusCode)
		if code == http.StatusNoContent || code == http.StatusNotModified {
			// No body on the wire (httptest's recorder keeps what a server drops).
			require.Empty(t, secondBody)
		} else {
			require.Equal(t, firstBody, secondBody, "the body is replayed byte for byte")
		}
		for _, name := range []string{"Location", "Content-Type", "ETag"} {
			for _, v := range first.Header.Values(name) {
				// Never sent, as never stored: could split or truncate a
				// header, or not survive storage.
				require.True(t, !strings.ContainsAny(v, "\r\n\x00") && utf8.ValidString(v), "%s %q sent", name, v)
			}
			require.Equal(t, first.Header.Values(name), second.Header.Values(name), "%s is replayed as the first client got it", name)
		}
		for _, name := range neverReplayed {
			require.Empty(t, second.Header.Values(name), "%s must never be replayed", name)
		}
	})
}
