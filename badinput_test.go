package idem_test

// The bad-input catalogue: hostile or malformed HTTP requests (and one
// hostile handler) through the middleware, each with the status it must get
// and how many times the handler may run. Requests a Go client refuses to
// send (control characters, lying Content-Length, ...) are written as raw
// bytes on a TCP connection.

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
)

// badHandler is the guarded handler: 201 with a Location and a body that
// tells which call it was and how many body bytes it got. Some paths answer
// with hostile headers.
type badHandler struct {
	calls   atomic.Int32
	release chan struct{} // /slow waits for it
	started chan struct{} // /slow signals it started
}

func (h *badHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := h.calls.Add(1)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "body", http.StatusBadRequest)
		return
	}
	hdr := w.Header()
	switch r.URL.Path {
	case "/crlf": // header injection attempt: net/http turns CR/LF into spaces on the wire
		hdr.Set("Location", "/orders/1\r\nSet-Cookie: stolen=1")
		hdr.Set("Content-Language", "en\nX-Evil: 1")
	case "/nul":
		hdr.Set("Content-Location", "/orders/1\x00evil")
	case "/latin1": // a header value that is not UTF-8 (obs-text)
		hdr.Set("ETag", "\"caf\xe9\"")
	case "/slow":
		h.started <- struct{}{}
		<-h.release
	default:
		hdr.Set("Location", fmt.Sprintf("/orders/%d", n))
	}
	hdr.Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"call":%d,"body_len":%d,"method":%q}`, n, len(body), r.Method)
}

// step is one request of a case.
type step struct {
	method, path string
	user         string   // Authorization: Bearer <user>; "" sends none
	keys         []string // Idempotency-Key fields; nil sends none
	body         string
	reader       io.Reader // body of unknown length (chunked), instead of body
	raw          string    // a whole raw request, sent as is ("{K}" is the case's key)
	closeWrite   bool      // after a raw request, half-close the connection
	status       int
	slug         string // the problem slug expected, for the middleware's refusals
	replay       bool   // the answer must be a replay of the case's first answer
	statusOnly   bool   // raw: read only the status line (the answer is not valid HTTP for Go's client)
	check        func(t *testing.T, a answer)
}

type badCase struct {
	name  string
	steps func(k string) []step
	calls int32 // handler executions the whole case may cause
}

func one(s step) func(string) []step {
	return func(k string) []step {
		for i, v := range s.keys {
			s.keys[i] = strings.ReplaceAll(v, "{K}", k)
		}
		s.raw = strings.ReplaceAll(s.raw, "{K}", k)
		return []step{s}
	}
}

// rawPOST builds a raw request with the given extra header lines and body;
// Content-Length is added unless a header line sets framing itself.
func rawPOST(path string, headers []string, body string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: example.test\r\nAuthorization: Bearer u\r\n", path)
	framed := false
	for _, h := range headers {
		l := strings.ToLower(h)
		if strings.HasPrefix(l, "content-length:") || strings.HasPrefix(l, "transfer-encoding:") {
			framed = true
		}
		b.WriteString(h + "\r\n")
	}
	if !framed {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n" + body)
	return b.String()
}

func badCatalogue() []badCase {
	const ok, bad = http.StatusCreated, http.StatusBadRequest
	long := func(n int) string { return strings.Repeat("k", n) }
	return []badCase{
		// --- the key ---
		{"key missing", one(step{user: "u", status: bad, slug: idem.ProblemKeyMissing}), 0},
		{"key empty", one(step{user: "u", keys: []string{""}, status: bad, slug: idem.ProblemKeyInvalid}), 0},
		{"key only spaces", one(step{user: "u", keys: []string{"   "}, status: bad, slug: idem.ProblemKeyInvalid}), 0},
		{"key 255 chars (limit)", func(k string) []step {
			return []step{{user: "u", keys: []string{long(255-len(k)) + k}, status: ok}}
		}, 1},
		{"key 256 chars", one(step{user: "u", keys: []string{long(256)}, status: bad, slug: idem.ProblemKeyInvalid}), 0},
		{"key 10,000 chars", one(step{user: "u", keys: []string{long(10_000)}, status: bad, slug: idem.ProblemKeyInvalid}), 0},
		{"quoted key 10,000 chars", one(step{user: "u", keys: []string{`"` + long(10_000) + `"`}, status: bad, slug: idem.ProblemKeyInvalid}), 0},
		{"key 2 MiB (header limit)", one(step{raw: rawPOST("/orders", []string{"Idempotency-Key: " + long(2<<20)}, ""), status: http.StatusRequestHeaderFieldsTooLarge}), 0},
		{"key with SOH control char", one(step{raw: rawPOST("/orders", []string{"Idempotency-Key: a\x01{K}"}, ""), status: bad}), 0},
		{"key with NUL", one(step{raw: rawPOST("/orders", []string{"Idempotency-Key: a\x00{K}"}, ""), status: bad}), 0},
		{"key with DEL", one(step{raw: rawPOST("/orders", []string{"Idempotency-Key: a\x7f{K}"}, ""), status: bad}), 0},
		{"key with inner tab", one(step{user: "u", keys: []string{"a\t{K}"}, status: bad, slug: idem.ProblemKeyInvalid}), 0},
		{"key with inner space", one(step{user: "u", keys: []string{"a {K}"}, status: bad, slug: idem.ProblemKeyInvalid}), 0},
		{"key non-ASCII UTF-8", one(step{user: "u", keys: []string{"clé-{K}"}, status: bad, slug: idem.ProblemKeyInvalid}), 0},
		{"key invalid UTF-8", one(step{raw: rawPOST("/orders", []string{"Idempotency-Key: \xff\xfe{K}"}, ""), status: bad, slug: idem.ProblemKeyInvalid}), 0},
		{"key obs-fold continuation", one(step{raw: rawPOST("/orders", []string{"Idempotency-Key: {K}", " folded"}, ""), status: bad, slug: idem.ProblemKeyInvalid}), 0},
		{"key header name with space", one(step{raw: rawPOST("/orders", []string{"Idempotency-Key : {K}"}, ""), status: bad}), 0},
		{"key header name lower case", one(step{raw: rawPOST("/orders", []string{"idempotency-key: {K}"}, ""), status: ok}), 1},
		{"key surrounded by spaces", func(k string) []step {
			return []step{
				{user: "u", keys: []string{"  " + k + "\t"}, status: ok},
				{user: "u", keys: []string{k}, status: ok, replay: true},
			}
		}, 1},
		{"quoted and bare are one key", func(k string) []step {
			return []step{
				{user: "u", keys: []string{`"` + k + `"`}, status: ok},
				{user: "u", keys: []string{k}, status: ok, replay: true},
			}
		}, 1},
		{"quoted key with escapes and space", func(k string) []step {
			return []step{
				{user: "u", keys: []string{`"a \"q\" \\ ` + k + `"`}, status: ok},
				{user: "u", keys: []string{`"a \"q\" \\ ` + k + `"`}, status: ok, replay: true},
			}
		}, 1},
		{"quoted key unterminated", one(step{user: "u", keys: []string{`"{K}`}, status: bad, slug: idem.ProblemKeyInvalid}), 0},
		{"quoted key with trailing text", one(step{user: "u", keys: []string{`"{K}"x`}, status: bad, slug: idem.ProblemKeyInvalid}), 0},
		{"quoted key with parameters", one(step{user: "u", keys: []string{`"{K}";v=1`}, status: bad, slug: idem.ProblemKeyInvalid}), 0},
		{"quoted key bad escape", one(step{user: "u", keys: []string{`"a\b{K}"`}, status: bad, slug: idem.ProblemKeyInvalid}), 0},
		{"quoted key empty", one(step{user: "u", keys: []string{`""`}, status: bad, slug: idem.ProblemKeyInvalid}), 0},
		{"quoted key with tab", one(step{user: "u", keys: []string{"\"a\t{K}\""}, status: bad, slug: idem.ProblemKeyInvalid}), 0},
		{"stray quote in bare key", one(step{user: "u", keys: []string{`a"{K}`}, status: bad, slug: idem.ProblemKeyInvalid}), 0},
		{"key list", one(step{user: "u", keys: []string{"{K}, other"}, status: bad, slug: idem.ProblemKeyInvalid}), 0},
		{"repeated key fields, different", one(step{user: "u", keys: []string{"{K}", "other"}, status: bad, slug: idem.ProblemKeyInvalid}), 0},
		{"repeated key fields, identical", one(step{user: "u", keys: []string{"{K}", "{K}"}, status: bad, slug: idem.ProblemKeyInvalid}), 0},

		// --- the caller (scope) ---
		{"no caller", one(step{keys: []string{"{K}"}, status: http.StatusUnauthorized, slug: idem.ProblemUnauthenticated}), 0},
		{"empty caller", one(step{raw: "POST /orders HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \r\nIdempotency-Key: {K}\r\nContent-Length: 0\r\n\r\n", status: http.StatusUnauthorized, slug: idem.ProblemUnauthenticated}), 0},
		{"caller of 2,000 chars", one(step{user: long(2000), keys: []string{"{K}"}, status: http.StatusUnauthorized, slug: idem.ProblemUnauthenticated}), 0},
		{"caller invalid UTF-8", one(step{raw: "POST /orders HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\nIdempotency-Key: {K}\r\nContent-Length: 0\r\n\r\n", status: http.StatusUnauthorized, slug: idem.ProblemUnauthenticated}), 0},
		{"caller with control character", one(step{raw: "POST /orders HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer u\x1f1\r\nIdempotency-Key: {K}\r\nContent-Length: 0\r\n\r\n", status: bad}), 0},
		{"scope+key collide after naive concatenation", func(k string) []step {
			return []step{
				{user: "ab", keys: []string{"c" + k}, status: ok},
				{user: "a", keys: []string{"bc" + k}, status: ok, check: notReplayed},
			}
		}, 2},
		{"scope+key collide across a separator", func(k string) []step {
			return []step{
				{user: "u:1", keys: []string{k}, status: ok},
				{user: "u", keys: []string{"1:" + k}, status: ok, check: notReplayed},
				{user: "u:", keys: []string{"1" + k}, status: ok, check: notReplayed},
			}
		}, 3},
		{"braces in scope and key (Redis hash tags)", func(k string) []step {
			return []step{
				{user: "{alice}", keys: []string{k}, status: ok},
				{user: "alice", keys: []string{"{" + k + "}"}, status: ok, check: notReplayed},
				{user: "{alice}" + k, keys: []string{"x"}, status: ok, check: notReplayed},
				{user: "}{", keys: []string{k}, status: ok, check: notReplayed},
			}
		}, 4},
		{"another scope's key is a new key", func(k string) []step {
			return []step{
				{user: "alice", keys: []string{k}, body: "same", status: ok},
				{user: "bob", keys: []string{k}, body: "same", status: ok, check: notReplayed},
				{user: "alice", keys: []string{k}, body: "same", status: ok, replay: true},
			}
		}, 2},

		// --- the body ---
		{"body at the 1 MiB limit", one(step{user: "u", keys: []string{"{K}"}, body: strings.Repeat("b", idem.DefaultMaxBody), status: ok}), 1},
		{"body 1 MiB + 1", one(step{user: "u", keys: []string{"{K}"}, body: strings.Repeat("b", idem.DefaultMaxBody+1), status: http.StatusRequestEntityTooLarge, slug: idem.ProblemBodyTooLarge}), 0},
		{"body 8 MiB chunked, no length", func(k string) []step {
			return []step{{user: "u", keys: []string{k}, reader: io.LimitReader(zeros{}, 8<<20),
				status: http.StatusRequestEntityTooLarge, slug: idem.ProblemBodyTooLarge}}
		}, 0},
		{"Content-Length 10 MiB declared", one(step{raw: rawPOST("/orders", []string{"Idempotency-Key: {K}", "Content-Length: 10485760"}, "only a little"), status: http.StatusRequestEntityTooLarge, slug: idem.ProblemBodyTooLarge}), 0},
		{"Content-Length larger than the body (truncated)", one(step{raw: rawPOST("/orders", []string{"Idempotency-Key: {K}", "Content-Length: 100"}, "0123456789"), closeWrite: true, status: bad, slug: idem.ProblemBodyInvalid}), 0},
		{"Content-Length smaller than the body", one(step{raw: rawPOST("/orders", []string{"Idempotency-Key: {K}", "Content-Length: 5"}, "01234XXXXXXXXXX"), status: ok, check: func(t *testing.T, a answer) {
			require.Contains(t, string(a.body), `"body_len":5`, "the handler gets exactly Content-Length bytes")
		}}), 1},
		{"Content-Length not a number", one(step{raw: rawPOST("/orders", []string{"Idempotency-Key: {K}", "Content-Length: abc"}, ""), status: bad}), 0},
		{"Content-Length negative", one(step{raw: rawPOST("/orders", []string{"Idempotency-Key: {K}", "Content-Length: -1"}, ""), status: bad}), 0},
		{"two different Content-Lengths", one(step{raw: rawPOST("/orders", []string{"Idempotency-Key: {K}", "Content-Length: 3", "Content-Length: 4"}, "abcd"), status: bad}), 0},
		{"Content-Length with Transfer-Encoding", func(k string) []step {
			r := rawPOST("/orders", []string{"Idempotency-Key: " + k, "Content-Length: 3", "Transfer-Encoding: chunked"}, "4\r\nabcd\r\n0\r\n\r\n")
			return []step{
				{raw: r, status: ok, check: func(t *testing.T, a answer) {
					require.Contains(t, string(a.body), `"body_len":4`, "chunked framing wins, as RFC 9112 says")
				}},
				{raw: rawPOST("/orders", []string{"Idempotency-Key: " + k}, "abcd"), status: ok, replay: true},
			}
		}, 1},
		{"chunked body truncated", one(step{raw: rawPOST("/orders", []string{"Idempotency-Key: {K}", "Transfer-Encoding: chunked"}, "64\r\n0123456789"), closeWrite: true, status: bad, slug: idem.ProblemBodyInvalid}), 0},
		{"chunk size not hex", one(step{raw: rawPOST("/orders", []string{"Idempotency-Key: {K}", "Transfer-Encoding: chunked"}, "zz\r\nabc\r\n0\r\n\r\n"), status: bad, slug: idem.ProblemBodyInvalid}), 0},
		{"body invalid UTF-8 and NUL bytes", func(k string) []step {
			body := "\xff\xfe\x00\x00binary\xc3"
			return []step{
				{user: "u", keys: []string{k}, body: body, status: ok},
				{user: "u", keys: []string{k}, body: body, status: ok, replay: true},
				{user: "u", keys: []string{k}, body: body[:len(body)-1], status: http.StatusUnprocessableEntity, slug: idem.ProblemKeyReused},
			}
		}, 1},
		{"same key, body differs by a newline", func(k string) []step {
			return []step{
				{user: "u", keys: []string{k}, body: `{"a":1}`, status: ok},
				{user: "u", keys: []string{k}, body: `{"a":1}` + "\n", status: http.StatusUnprocessableEntity, slug: idem.ProblemKeyReused},
			}
		}, 1},
		{"same key, query string added", func(k string) []step {
			return []step{
				{user: "u", keys: []string{k}, status: ok},
				{user: "u", keys: []string{k}, path: "/orders?", status: http.StatusUnprocessableEntity, slug: idem.ProblemKeyReused},
			}
		}, 1},

		// --- methods ---
		{"PATCH guarded", func(k string) []step {
			return []step{
				{method: "PATCH", user: "u", keys: []string{k}, status: ok},
				{method: "PATCH", user: "u", keys: []string{k}, status: ok, replay: true},
				{method: "POST", user: "u", keys: []string{k}, status: http.StatusUnprocessableEntity, slug: idem.ProblemKeyReused},
			}
		}, 1},
		{"GET passes through unguarded", passThrough("GET"), 2},
		{"PUT passes through unguarded", passThrough("PUT"), 2},
		{"DELETE passes through unguarded", passThrough("DELETE"), 2},
		{"OPTIONS passes through unguarded", passThrough("OPTIONS"), 2},
		{"lower-case post is another method", func(k string) []step {
			r := strings.Replace(rawPOST("/orders", []string{"Idempotency-Key: " + k}, ""), "POST", "post", 1)
			return []step{{raw: r, status: ok}, {raw: r, status: ok, check: notReplayed}}
		}, 2},

		// --- a hostile handler ---
		{"handler header with CR/LF is not replayed", func(k string) []step {
			return []step{
				{user: "u", keys: []string{k}, path: "/crlf", status: ok, check: func(t *testing.T, a answer) {
					require.Empty(t, a.header.Values("Set-Cookie"), "net/http never lets CR/LF split a header")
				}},
				{user: "u", keys: []string{k}, path: "/crlf", status: ok, check: func(t *testing.T, a answer) {
					require.Equal(t, "true", a.header.Get(idem.HeaderReplayed))
					require.Empty(t, a.header.Values("Location"), "a value with CR/LF is dropped, not replayed")
					require.Empty(t, a.header.Values("Content-Language"))
					require.Empty(t, a.header.Values("Set-Cookie"))
					require.Empty(t, a.header.Values("X-Evil"))
				}},
			}
		}, 1},
		{"handler header with NUL is not replayed", func(k string) []step {
			return []step{
				// Go's client refuses the NUL that net/http lets through.
				{raw: rawPOST("/nul", []string{"Idempotency-Key: " + k}, ""), statusOnly: true, status: ok},
				{raw: rawPOST("/nul", []string{"Idempotency-Key: " + k}, ""), status: ok, check: func(t *testing.T, a answer) {
					require.Equal(t, "true", a.header.Get(idem.HeaderReplayed))
					require.Empty(t, a.header.Values("Content-Location"))
				}},
			}
		}, 1},
		{"handler header not UTF-8 replays byte for byte", func(k string) []step {
			return []step{
				{user: "u", keys: []string{k}, path: "/latin1", status: ok},
				{user: "u", keys: []string{k}, path: "/latin1", status: ok, check: func(t *testing.T, a answer) {
					require.Equal(t, "true", a.header.Get(idem.HeaderReplayed))
					got := a.header.Get("ETag")
					require.True(t, got == "" || got == "\"caf\xe9\"",
						"a header is replayed byte for byte or not at all, never altered: got %q", got)
				}},
			}
		}, 1},
	}
}

func notReplayed(t *testing.T, a answer) {
	t.Helper()
	require.Empty(t, a.header.Get(idem.HeaderReplayed), "a different intent must not be replayed another one's answer")
}

func passThrough(method string) func(string) []step {
	return func(k string) []step {
		s := step{method: method, user: "u", keys: []string{k}, status: http.StatusCreated, check: notReplayed}
		return []step{s, s}
	}
}

// zeros is an endless reader of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func TestBadInputCatalogue(t *testing.T) {
	cat := badCatalogue()
	require.GreaterOrEqual(t, len(cat), 30)
	for _, strategy := range []string{"table", "hybrid"} {
		t.Run("strategy="+strategy, func(t *testing.T) {
			b := setup(t, strategy)
			h := &badHandler{}
			srv := httptest.NewServer(b.guard.Middleware(bearerScope, nil)(h))
			t.Cleanup(srv.Close)
			for _, tc := range cat {
				t.Run(tc.name, func(t *testing.T) {
					before := h.calls.Load()
					var first answer
					for i, s := range tc.steps(newKey()) {
						a := badSend(t, srv, s)
						require.Equal(t, s.status, a.status, "step %d: %s", i, a.body)
						if s.slug != "" {
							require.Equal(t, idem.ProblemBase+s.slug, a.problem(t).Type, "step %d", i)
						}
						if s.replay {
							require.Equal(t, "true", a.header.Get(idem.HeaderReplayed), "step %d", i)
							require.Equal(t, first.body, a.body, "step %d: a replay is byte for byte", i)
							require.Equal(t, first.header.Get("Location"), a.header.Get("Location"))
						}
						if s.check != nil {
							s.check(t, a)
						}
						if i == 0 {
							first = a
						}
					}
					require.Equal(t, tc.calls, h.calls.Load()-before, "handler executions")
				})
			}
		})
	}
}

// badSend sends one step and returns the answer.
func badSend(t *testing.T, srv *httptest.Server, s step) answer {
	t.Helper()
	if s.raw != "" {
		return sendRaw(t, srv.Listener.Addr().String(), s.raw, s.closeWrite, s.statusOnly)
	}
	a, err := badTry(srv, s)
	require.NoError(t, err)
	return a
}

// badTry is badSend for a step without raw bytes, returning the error
// instead of failing the test: for goroutines, where require must not run.
func badTry(srv *httptest.Server, s step) (answer, error) {
	if s.method == "" {
		s.method = http.MethodPost
	}
	if s.path == "" {
		s.path = "/orders"
	}
	body := s.reader
	if body == nil {
		body = strings.NewReader(s.body)
	} else {
		body = io.MultiReader(body) // hide the length: chunked
	}
	r, err := http.NewRequest(s.method, srv.URL+s.path, body)
	if err != nil {
		return answer{}, err
	}
	if s.user != "" {
		r.Header.Set("Authorization", "Bearer "+s.user)
	}
	for _, k := range s.keys {
		r.Header.Add(idem.HeaderKey, k)
	}
	resp, err := srv.Client().Do(r)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	return answer{resp.StatusCode, resp.Header, got}, nil
}

// sendRaw writes a raw request on a new connection and reads the first
// answer.
func sendRaw(t *testing.T, addr, raw string, closeWrite, statusOnly bool) answer {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	// The server may answer (413, 431) and close before reading everything:
	// write in the background and read the answer regardless.
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		_, _ = io.Copy(c, strings.NewReader(raw))
		if closeWrite {
			_ = c.(*net.TCPConn).CloseWrite()
		}
	}()
	br := bufio.NewReader(c)
	if statusOnly {
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		var proto string
		var status int
		_, err = fmt.Sscanf(line, "%s %d", &proto, &status)
		require.NoError(t, err, line)
		_ = c.Close()
		<-wrote
		return answer{status: status, header: http.Header{}}
	}
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	_ = c.Close()
	<-wrote
	return answer{resp.StatusCode, resp.Header, body}
}

// Another caller cannot take, or be blocked by, a key in progress in
// another scope: the lease and the row are per (scope, key).
func TestBadInputScopeCannotForgeInProgress(t *testing.T) {
	for _, strategy := range []string{"table", "hybrid"} {
		t.Run("strategy="+strategy, func(t *testing.T) {
			b := setup(t, strategy)
			h := &badHandler{release: make(chan struct{}), started: make(chan struct{}, 1)}
			srv := httptest.NewServer(b.guard.Middleware(bearerScope, nil)(h))
			t.Cleanup(srv.Close)
			release := sync.OnceFunc(func() { close(h.release) })
			t.Cleanup(release) // runs first: never leave the handler blocked
			k := newKey()
			type sent struct {
				a   answer
				err error
			}
			done := make(chan sent, 1)
			go func() {
				a, err := badTry(srv, step{user: "bob", keys: []string{k}, path: "/slow"})
				done <- sent{a, err}
			}()
			<-h.started
			// bob's intent is in progress: bob's retry is 409, alice's and the
			// look-alike scopes are new intents.
			require.Equal(t, http.StatusConflict, badSend(t, srv, step{user: "bob", keys: []string{k}, path: "/slow"}).status)
			for _, user := range []string{"alice", "Bob", "{bob}", "bo", "bob:", "bob\u00a0"} {
				a := badSend(t, srv, step{user: user, keys: []string{k}, path: "/orders"})
				require.Equal(t, http.StatusCreated, a.status, "scope %q", user)
				require.Empty(t, a.header.Get(idem.HeaderReplayed))
			}
			release()
			first := <-done
			require.NoError(t, first.err)
			require.Equal(t, http.StatusCreated, first.a.status)
			require.EqualValues(t, 7, h.calls.Load())
			if b.redis != nil {
				// The lease keys of look-alike intents differ and carry exactly
				// one hash tag, which no scope or key can extend.
				l := mustLocker(t, b.redis)
				seen := map[string]bool{}
				for _, p := range [][2]string{{"ab", "c"}, {"a", "bc"}, {"{a}", "b"}, {"a", "{b}"}, {"a}", "{b"}, {"", "ab"}, {"ab", ""}} {
					key := l.Key(p[0], p[1])
					require.False(t, seen[key], "%q", p)
					seen[key] = true
					require.Equal(t, 1, strings.Count(key, "{"), key)
					require.Equal(t, 1, strings.Count(key, "}"), key)
					require.True(t, strings.HasSuffix(key, "}"), key)
				}
			}
		})
	}
}
