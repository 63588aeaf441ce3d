package idem_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/idemtest"
)

// bearerScope is the tests' authentication: "Authorization: Bearer <user>".
func bearerScope(r *http.Request) (string, bool) {
	return strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
}

// requireRetryAfter requires one Retry-After of whole seconds within the
// jitter of hint (whole seconds): from hint to hint + max(1s, hint/5).
func requireRetryAfter(t *testing.T, h http.Header, hint time.Duration) {
	t.Helper()
	v := h.Values("Retry-After")
	require.Len(t, v, 1)
	secs, err := strconv.Atoi(v[0])
	require.NoError(t, err, "Retry-After %q", v[0])
	base := int(hint / time.Second)
	require.GreaterOrEqual(t, secs, base, "never below the hint")
	require.LessOrEqual(t, secs, base+max(1, (base+4)/5), "never past the hint by more than the jitter")
}

// orderHandler answers like a checkout: 201 with Location, a cookie that
// must never be replayed, and the body it received echoed back.
type orderHandler struct {
	calls atomic.Int32
}

func (h *orderHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := h.calls.Add(1)
	body, _ := io.ReadAll(r.Body)
	if bytes.Contains(body, []byte("pm_declined")) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusPaymentRequired)
		_, _ = w.Write([]byte(`{"title":"card declined"}`))
		return
	}
	if bytes.Contains(body, []byte("pm_timeout")) {
		w.WriteHeader(http.StatusGatewayTimeout)
		return
	}
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", n))
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Set-Cookie", "session=secret")
	w.Header().Set("X-Request-Id", fmt.Sprint("req-", n))
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"order":%d,"echo":%q}`, n, body)
}

type httpBundle struct {
	bundle
	srv     *httptest.Server
	handler *orderHandler
}

// setupHTTP serves next (an orderHandler when nil) through the middleware,
// with cfg when one is given.
func setupHTTP(t *testing.T, strategy string, next http.Handler, cfg ...*idem.MiddlewareConfig) httpBundle {
	t.Helper()
	b := setup(t, strategy)
	h, _ := next.(*orderHandler)
	if next == nil {
		h = &orderHandler{}
		next = h
	}
	var c *idem.MiddlewareConfig
	if len(cfg) > 0 {
		c = cfg[0]
	}
	srv := httptest.NewServer(b.guard.Middleware(bearerScope, c)(next))
	t.Cleanup(srv.Close)
	return httpBundle{bundle: b, srv: srv, handler: h}
}

type call struct {
	method, path, user, body string
	keys                     []string
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) problem(t *testing.T) idem.Problem {
	t.Helper()
	require.Equal(t, "application/problem+json", a.header.Get("Content-Type"))
	require.Equal(t, "no-store", a.header.Get("Cache-Control"))
	var p idem.Problem
	require.NoError(t, json.Unmarshal(a.body, &p))
	require.Equal(t, a.status, p.Status)
	return p
}

func send(t *testing.T, srv *httptest.Server, c call) answer {
	t.Helper()
	if c.method == "" {
		c.method = http.MethodPost
	}
	if c.path == "" {
		c.path = "/orders"
	}
	r, err := http.NewRequest(c.method, srv.URL+c.path, strings.NewReader(c.body))
	require.NoError(t, err)
	if c.user != "" {
		r.Header.Set("Authorization", "Bearer "+c.user)
	}
	for _, k := range c.keys {
		r.Header.Add(idem.HeaderKey, k)
	}
	resp, err := srv.Client().Do(r)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{resp.StatusCode, resp.Header, body}
}

func TestMiddlewareReplaysByteForByte(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		hb := setupHTTP(t, strategy, nil)
		c := call{user: "alice", keys: []string{newKey()}, body: `{"hold_ids":[88211,88212],"payment_method":"pm_ok"}`}
		first := send(t, hb.srv, c)
		require.Equal(t, http.StatusCreated, first.status)
		require.Equal(t, "session=secret", first.header.Get("Set-Cookie"))
		require.Empty(t, first.header.Get(idem.HeaderReplayed))
		require.Contains(t, string(first.body), `pm_ok`, "the handler got the body unchanged")

		again := send(t, hb.srv, c)
		require.Equal(t, first.status, again.status)
		require.Equal(t, first.body, again.body)
		for _, h := range []string{"Location", "Content-Type"} {
			require.Equal(t, first.header.Values(h), again.header.Values(h), h)
		}
		require.Equal(t, "true", again.header.Get(idem.HeaderReplayed))
		require.Empty(t, again.header.Get("Set-Cookie"), "cookies are never stored")
		require.Empty(t, again.header.Get("X-Request-Id"), "only allowlisted headers are stored")
		require.EqualValues(t, 1, hb.handler.calls.Load())

		// The quoted form of the same key is the same key.
		quoted := c
		quoted.keys = []string{`"` + c.keys[0] + `"`}
		require.Equal(t, first.body, send(t, hb.srv, quoted).body)
		require.EqualValues(t, 1, hb.handler.calls.Load())
	})
}

func TestMiddlewareOutcomes(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		hb := setupHTTP(t, strategy, nil)
		key := newKey()
		send(t, hb.srv, call{user: "alice", keys: []string{key}, body: "a"})

		// Same key, other body: 422, never the stored answer.
		a := send(t, hb.srv, call{user: "alice", keys: []string{key}, body: "b"})
		require.Equal(t, http.StatusUnprocessableEntity, a.status)
		require.Equal(t, idem.ProblemBase+idem.ProblemKeyReused, a.problem(t).Type)
		require.NotContains(t, string(a.body), "order")

		// Same key, other path: also a different request.
		a = send(t, hb.srv, call{user: "alice", keys: []string{key}, body: "a", path: "/orders?x=1"})
		require.Equal(t, http.StatusUnprocessableEntity, a.status)

		// Same key, another user: a key nobody has seen.
		a = send(t, hb.srv, call{user: "bob", keys: []string{key}, body: "a"})
		require.Equal(t, http.StatusCreated, a.status)

		// 402 is an answer: stored and replayed as 402.
		k402 := newKey()
		a = send(t, hb.srv, call{user: "alice", keys: []string{k402}, body: "pm_declined"})
		require.Equal(t, http.StatusPaymentRequired, a.status)
		b := send(t, hb.srv, call{user: "alice", keys: []string{k402}, body: "pm_declined"})
		require.Equal(t, http.StatusPaymentRequired, b.status)
		require.Equal(t, a.body, b.body)
		require.Equal(t, "true", b.header.Get(idem.HeaderReplayed))

		// 504 is not: the key stays in progress.
		k504 := newKey()
		require.Equal(t, http.StatusGatewayTimeout, send(t, hb.srv, call{user: "alice", keys: []string{k504}, body: "pm_timeout"}).status)
		a = send(t, hb.srv, call{user: "alice", keys: []string{k504}, body: "pm_timeout"})
		require.Equal(t, http.StatusConflict, a.status)
		requireRetryAfter(t, a.header, time.Second)
		require.Equal(t, idem.ProblemBase+idem.ProblemInProgress, a.problem(t).Type)

		// Once no running request can hold it (older than MaxHold), the
		// key waits for reconciliation: its own problem, a longer wait.
		_, err := hb.pool.Exec(t.Context(), "UPDATE "+hb.store.Table()+" SET created_at = now() - interval '2 minutes', hold_until = now() - interval '1 minute' WHERE key = $1", k504)
		require.NoError(t, err)
		hb.forgetLease(t, "alice", k504) // its 30 s have passed too
		a = send(t, hb.srv, call{user: "alice", keys: []string{k504}, body: "pm_timeout"})
		require.Equal(t, http.StatusConflict, a.status)
		requireRetryAfter(t, a.header, 30*time.Second)
		require.Equal(t, idem.ProblemBase+idem.ProblemPending, a.problem(t).Type)

		require.EqualValues(t, 4, hb.handler.calls.Load())
	})
}

// MiddlewareConfig.Fingerprint: a function that leaves out a tracking
// parameter makes a retry with another value of it a replay, not a 422.
func TestMiddlewareCustomFingerprint(t *testing.T) {
	withoutTracking := func(r *http.Request, body []byte) idem.Fingerprint {
		q := r.URL.Query()
		q.Del("utm_source")
		return idem.HashRequest(r.Method, r.URL.Path+"?"+q.Encode(), body)
	}
	hb := setupHTTP(t, "table", nil, &idem.MiddlewareConfig{Fingerprint: withoutTracking})
	k := newKey()
	first := send(t, hb.srv, call{user: "u", keys: []string{k}, body: "a", path: "/orders?utm_source=mail"})
	require.Equal(t, http.StatusCreated, first.status)
	again := send(t, hb.srv, call{user: "u", keys: []string{k}, body: "a", path: "/orders?utm_source=app"})
	require.Equal(t, http.StatusCreated, again.status)
	require.Equal(t, "true", again.header.Get(idem.HeaderReplayed))
	require.Equal(t, first.body, again.body)
	other := send(t, hb.srv, call{user: "u", keys: []string{k}, body: "b", path: "/orders?utm_source=app"})
	require.Equal(t, http.StatusUnprocessableEntity, other.status, "the body still counts")
	require.EqualValues(t, 1, hb.handler.calls.Load())
}

func TestMiddlewareRefusals(t *testing.T) {
	hb := setupHTTP(t, "table", nil)
	for _, tc := range []struct {
		name   string
		c      call
		status int
		slug   string
	}{
		{"no key", call{user: "u"}, 400, idem.ProblemKeyMissing},
		{"empty key", call{user: "u", keys: []string{""}}, 400, idem.ProblemKeyInvalid},
		{"repeated key", call{user: "u", keys: []string{"a", "b"}}, 400, idem.ProblemKeyInvalid},
		{"long key", call{user: "u", keys: []string{strings.Repeat("k", 256)}}, 400, idem.ProblemKeyInvalid},
		{"list key", call{user: "u", keys: []string{"a,b"}}, 400, idem.ProblemKeyInvalid},
		{"no caller", call{keys: []string{"k"}}, 401, idem.ProblemUnauthenticated},
		{"no caller no key", call{}, 401, idem.ProblemUnauthenticated},
		{"body too large", call{user: "u", keys: []string{"k"}, body: strings.Repeat("x", idem.DefaultMaxBody+1)}, 413, idem.ProblemBodyTooLarge},
		{"PATCH guarded", call{method: "PATCH", user: "u"}, 400, idem.ProblemKeyMissing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := send(t, hb.srv, tc.c)
			require.Equal(t, tc.status, a.status)
			require.Equal(t, idem.ProblemBase+tc.slug, a.problem(t).Type)
		})
	}
	require.Zero(t, hb.handler.calls.Load(), "no refused request reaches the handler")

	// Methods other than POST and PATCH pass through unguarded.
	for _, m := range []string{"GET", "PUT", "DELETE"} {
		a := send(t, hb.srv, call{method: m, path: "/x"})
		require.Equal(t, http.StatusCreated, a.status, m)
	}
	require.EqualValues(t, 3, hb.handler.calls.Load())
}

// A body that ends before its Content-Length is refused before the handler.
func TestMiddlewareTruncatedBody(t *testing.T) {
	b := setup(t, "table")
	h := &orderHandler{}
	mw := b.guard.Middleware(bearerScope, nil)(h)
	r := httptest.NewRequest("POST", "/orders", io.MultiReader(strings.NewReader("abc"), errReader{}))
	r.Header.Set("Authorization", "Bearer u")
	r.Header.Set(idem.HeaderKey, "k")
	w := httptest.NewRecorder()
	mw.ServeHTTP(w, r)
	require.Equal(t, http.StatusBadRequest, w.Code)
	require.Contains(t, w.Body.String(), idem.ProblemBodyInvalid)
	require.Zero(t, h.calls.Load())
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

// A MiddlewareConfig with a negative size is a bug of the caller's:
// Middleware panics, naming the field, as it does without a ScopeFunc.
func TestMiddlewareConfigRefusesNegatives(t *testing.T) {
	g, err := idem.New(idemtest.NewMemStore(nil), nil)
	require.NoError(t, err)
	require.PanicsWithValue(t, "idem: MiddlewareConfig.MaxBody must not be negative, got -1",
		func() { g.Middleware(bearerScope, &idem.MiddlewareConfig{MaxBody: -1}) })
	require.NotPanics(t, func() { g.Middleware(bearerScope, nil) })
}

func TestMiddlewareOptions(t *testing.T) {
	var rendered []idem.Problem
	hb := setupHTTP(t, "table", nil, &idem.MiddlewareConfig{
		OptionalKey:   true,
		StoredHeaders: []string{"Location", "X-Request-Id", "Set-Cookie"},
		MaxBody:       64, // an answer here is shorter
		RenderProblem: func(w http.ResponseWriter, r *http.Request, p idem.Problem) {
			rendered = append(rendered, p)
			p.Type = "https://stagedoor.example/problems/" + p.Slug
			if p.Status == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="checkout"`)
			}
			p.Write(w)
		},
	})
	// Optional key: a request without one is not guarded.
	require.Equal(t, http.StatusCreated, send(t, hb.srv, call{user: "u"}).status)
	require.Equal(t, http.StatusCreated, send(t, hb.srv, call{user: "u"}).status)
	require.EqualValues(t, 2, hb.handler.calls.Load())

	// Only POST and PATCH are guarded: a PUT passes through.
	require.Equal(t, http.StatusCreated, send(t, hb.srv, call{method: "PUT", user: "u", keys: []string{"k"}}).status)
	require.Equal(t, http.StatusCreated, send(t, hb.srv, call{method: "PUT", user: "u", keys: []string{"k"}}).status)
	require.EqualValues(t, 4, hb.handler.calls.Load())

	key := newKey()
	first := send(t, hb.srv, call{method: "PATCH", user: "u", keys: []string{key}})
	again := send(t, hb.srv, call{method: "PATCH", user: "u", keys: []string{key}})
	require.Equal(t, http.StatusCreated, again.status, "%s", again.body)
	require.Equal(t, first.header.Get("X-Request-Id"), again.header.Get("X-Request-Id"))
	require.Empty(t, again.header.Get("Set-Cookie"), "Set-Cookie is never stored, even when listed")

	a := send(t, hb.srv, call{user: "u", keys: []string{newKey()}, body: strings.Repeat("x", 65)})
	require.Equal(t, http.StatusRequestEntityTooLarge, a.status)
	require.Equal(t, "https://stagedoor.example/problems/request-body-too-large", a.problem(t).Type)

	a = send(t, hb.srv, call{keys: []string{"k"}})
	require.Equal(t, http.StatusUnauthorized, a.status)
	require.Equal(t, `Bearer realm="checkout"`, a.header.Get("WWW-Authenticate"), "added by the renderer")
	require.Len(t, rendered, 2)
	require.Equal(t, idem.ProblemUnauthenticated, rendered[1].Slug)
}

// A streamed or oversized answer is delivered but not stored: the key stays
// in progress.
func TestMiddlewareUnstorableAnswers(t *testing.T) {
	handlers := map[string]http.HandlerFunc{
		"flushed": func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte("part 1;"))
			w.(http.Flusher).Flush()
			_, _ = w.Write([]byte("part 2"))
		},
		"controller flush": func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte("part 1;"))
			require.NoError(t, http.NewResponseController(w).Flush())
		},
		"too large": func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write(bytes.Repeat([]byte("x"), 2048))
		},
	}
	for name, h := range handlers {
		t.Run(name, func(t *testing.T) {
			var calls atomic.Int32
			hb := setupHTTP(t, "table", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				h(w, r)
			}), &idem.MiddlewareConfig{MaxBody: 1024})
			key := newKey()
			first := send(t, hb.srv, call{user: "u", keys: []string{key}})
			require.Equal(t, http.StatusOK, first.status)
			require.NotEmpty(t, first.body, "the answer is delivered")
			a := send(t, hb.srv, call{user: "u", keys: []string{key}})
			require.Equal(t, http.StatusConflict, a.status)
			require.EqualValues(t, 1, calls.Load())
		})
	}
}

// An answer with no explicit Content-Type replays with the type the client
// first got (net/http sniffs it), and an empty 200 replays as an empty 200.
func TestMiddlewareImplicitAnswers(t *testing.T) {
	hb := setupHTTP(t, "table", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/html" {
			_, _ = w.Write([]byte("<html><body>ok</body></html>"))
		}
	}))
	for _, path := range []string{"/html", "/empty"} {
		key := newKey()
		first := send(t, hb.srv, call{user: "u", keys: []string{key}, path: path})
		again := send(t, hb.srv, call{user: "u", keys: []string{key}, path: path})
		require.Equal(t, http.StatusOK, again.status)
		require.Equal(t, first.header.Get("Content-Type"), again.header.Get("Content-Type"), path)
		require.Equal(t, first.body, again.body, path)
		require.Equal(t, "true", again.header.Get(idem.HeaderReplayed))
	}
}

// PostgreSQL down: 503 with a problem, no internal error text, handler not run.
func TestMiddlewareStoreUnavailable(t *testing.T) {
	pool, err := pgxpool.New(t.Context(), "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := durable.New(pool, nil)
	require.NoError(t, err)
	var logs bytes.Buffer
	g, err := idem.New(store, &idem.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	h := &orderHandler{}
	srv := httptest.NewServer(g.Middleware(bearerScope, nil)(h))
	defer srv.Close()
	a := send(t, srv, call{user: "u", keys: []string{"k"}})
	require.Equal(t, http.StatusServiceUnavailable, a.status)
	require.Equal(t, idem.ProblemBase+idem.ProblemServiceUnavailable, a.problem(t).Type)
	requireRetryAfter(t, a.header, 2*time.Second)
	require.NotContains(t, string(a.body), "127.0.0.1")
	require.NotContains(t, string(a.body), "connect")
	require.Contains(t, logs.String(), "store unavailable", "the cause goes to the log")
	require.Zero(t, h.calls.Load())

	// An outage is one ERROR line per cause and interval, not one or two
	// per refused request.
	for i := range 20 {
		r := send(t, srv, call{user: "u", keys: []string{"k" + strconv.Itoa(i)}})
		require.Equal(t, http.StatusServiceUnavailable, r.status)
	}
	require.Equal(t, 1, strings.Count(logs.String(), "level=ERROR"), "%s", logs.String())
	require.Zero(t, h.calls.Load())
}

func TestMiddlewareNeedsScopeFunc(t *testing.T) {
	b := setup(t, "table")
	require.Panics(t, func() { b.guard.Middleware(nil, nil) })
}

// A scope the guard cannot key on is refused as unauthenticated, and never
// reaches the handler.
func TestMiddlewareUnusableScope(t *testing.T) {
	b := setup(t, "table")
	h := &orderHandler{}
	scope := func(r *http.Request) (string, bool) { return strings.Repeat("u", idem.MaxScopeLen+1), true }
	srv := httptest.NewServer(b.guard.Middleware(scope, nil)(h))
	defer srv.Close()
	a := send(t, srv, call{keys: []string{"k"}})
	require.Equal(t, http.StatusUnauthorized, a.status)
	require.Equal(t, idem.ProblemBase+idem.ProblemUnauthenticated, a.problem(t).Type)
	require.Zero(t, h.calls.Load())
}

// firstRead signals once, on the first Read of the body it wraps: the
// middleware is then reading the body, its buffer made.
type firstRead struct {
	io.ReadCloser
	once   sync.Once
	signal chan<- struct{}
}

func (b *firstRead) Read(p []byte) (int, error) {
	b.once.Do(func() { b.signal <- struct{}{} })
	return b.ReadCloser.Read(p)
}

// 64 connections that declare a 1 MiB body and send only their headers do
// not pin 64 MiB: the body buffer grows with the bytes that arrive.
func TestMiddlewareHeaderOnlyRequestsPinNoMemory(t *testing.T) {
	const conns = 64
	g, err := idem.New(idemtest.NewMemStore(nil), nil)
	require.NoError(t, err)
	guarded := g.Middleware(bearerScope, nil)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("the handler ran without a body")
	}))
	reading := make(chan struct{}, conns)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = &firstRead{ReadCloser: r.Body, signal: reading}
		guarded.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range conns {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		_, err = fmt.Fprintf(c, "POST /orders HTTP/1.1\r\nHost: example.test\r\nAuthorization: Bearer u\r\n"+
			"Idempotency-Key: k-%d\r\nContent-Length: %d\r\n\r\n", i, idem.DefaultMaxBody)
		require.NoError(t, err)
	}
	for range conns {
		<-reading
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap grew by %d KiB for %d header-only requests", grown>>10, conns)
	require.Less(t, grown, int64(8<<20), "declared 64 MiB must not be allocated")
}

// A request with two Authorization fields is refused with 400 before the
// ScopeFunc is asked: a proxy reading the last field and a ScopeFunc
// reading the first would disagree about who the caller is. One field
// passes.
func TestMiddlewareRepeatedAuthorization(t *testing.T) {
	g, err := idem.New(idemtest.NewMemStore(nil), nil)
	require.NoError(t, err)
	var scoped atomic.Int32
	h := &orderHandler{}
	srv := httptest.NewServer(g.Middleware(func(r *http.Request) (string, bool) {
		scoped.Add(1)
		return bearerScope(r)
	}, nil)(h))
	t.Cleanup(srv.Close)
	post := func(auth ...string) answer {
		r, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader("a"))
		require.NoError(t, err)
		for _, a := range auth {
			r.Header.Add("Authorization", a)
		}
		r.Header.Set(idem.HeaderKey, "k")
		resp, err := srv.Client().Do(r)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return answer{resp.StatusCode, resp.Header, b}
	}
	for _, auth := range [][]string{{"Bearer alice", "Bearer mallory"}, {"Bearer alice", "Bearer alice"}, {"Bearer alice", ""}} {
		a := post(auth...)
		require.Equal(t, http.StatusBadRequest, a.status, "%q", auth)
		require.Equal(t, "application/problem+json", a.header.Get("Content-Type"))
		require.Equal(t, idem.ProblemBase+idem.ProblemAuthorizationRepeated, a.problem(t).Type)
	}
	require.Zero(t, scoped.Load(), "the ScopeFunc never saw a repeated Authorization")
	require.Zero(t, h.calls.Load())
	require.Equal(t, http.StatusCreated, post("Bearer alice").status)
	require.EqualValues(t, 1, h.calls.Load())
}

// A header value the store cannot keep byte for byte (not UTF-8, such as a
// Latin-1 ETag, or holding a NUL) is neither stored nor sent: the first
// client gets exactly the headers every replay gets, and nothing fails.
func TestMiddlewareUnstorableHeaderValues(t *testing.T) {
	g, err := idem.New(idemtest.NewMemStore(nil), nil)
	require.NoError(t, err)
	var calls atomic.Int32
	srv := httptest.NewServer(g.Middleware(bearerScope, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Location", "/orders/caf\u00e9") // valid UTF-8: kept
		w.Header()["Etag"] = []string{`"caf` + "\xe9" + `"`, `"ok"`}
		w.Header().Set("Content-Language", "fr\xff")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "created")
	})))
	t.Cleanup(srv.Close)
	first := send(t, srv, call{user: "u", keys: []string{"k"}})
	replay := send(t, srv, call{user: "u", keys: []string{"k"}})
	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, http.StatusCreated, replay.status)
	require.Equal(t, "true", replay.header.Get(idem.HeaderReplayed))
	require.EqualValues(t, 1, calls.Load())
	for _, a := range []answer{first, replay} {
		require.Equal(t, "/orders/caf\u00e9", a.header.Get("Location"))
		require.Equal(t, []string{`"ok"`}, a.header.Values("Etag"))
		require.Empty(t, a.header.Values("Content-Language"))
		require.Equal(t, "created", string(a.body))
	}
}

// blockedWriter is a client that reads nothing: its writes block until it is
// released, as a Write blocks on an HTTP/2 stream whose flow-control window
// never opens.
type blockedWriter struct {
	header   http.Header
	writing  chan struct{} // closed at the first write
	release  chan struct{}
	once     sync.Once
	status   int
	received bytes.Buffer
}

func newBlockedWriter() *blockedWriter {
	return &blockedWriter{header: http.Header{}, writing: make(chan struct{}), release: make(chan struct{})}
}

func (w *blockedWriter) Header() http.Header { return w.header }
func (w *blockedWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}
func (w *blockedWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.writing) })
	<-w.release
	return w.received.Write(p)
}

// A slow reader cannot hold its key: the answer is stored before the first
// byte is sent, so while the client blocks, the key is answered and every
// retry is replayed what the client will read.
func TestSlowReaderCannotHoldTheKey(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		hb := setupHTTP(t, strategy, nil)
		key := newKey()
		body := strings.Repeat("x", 200<<10) // a 200 KB answer
		mw := hb.guard.Middleware(bearerScope, nil)(hb.handler)
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer alice")
		r.Header.Set(idem.HeaderKey, key)
		w := newBlockedWriter()
		done := make(chan struct{})
		go func() { defer close(done); mw.ServeHTTP(w, r) }()
		<-w.writing

		rec, err := hb.store.Get(t.Context(), "alice", key)
		require.NoError(t, err)
		require.NotNil(t, rec.Answer, "the answer is stored before the client reads it")
		retry := send(t, hb.srv, call{user: "alice", keys: []string{key}, body: body})
		require.Equal(t, http.StatusCreated, retry.status)
		require.Equal(t, "true", retry.header.Get(idem.HeaderReplayed))

		close(w.release)
		<-done
		require.Equal(t, http.StatusCreated, w.status)
		require.Equal(t, string(retry.body), w.received.String(), "the client reads what every replay gets")
		require.EqualValues(t, 1, hb.handler.calls.Load())
	})
}

// A handler whose commit went through but whose reply was lost answers 500
// ("order not recorded"); the client gets the committed answer instead, as
// every retry does.
func TestLostCommitReplyGetsTheStoredAnswer(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, strategy string) {
		b := setup(t, strategy)
		var calls atomic.Int32
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			require.NoError(t, pgx.BeginFunc(r.Context(), b.pool, func(tx pgx.Tx) error {
				return idem.Complete(r.Context(), tx, created("committed"))
			}))
			// The COMMIT's reply was lost: the handler believes it failed.
			http.Error(w, `{"type":"order-not-recorded"}`, http.StatusInternalServerError)
		})
		srv := httptest.NewServer(b.guard.Middleware(bearerScope, nil)(h))
		t.Cleanup(srv.Close)
		key := newKey()
		first := send(t, srv, call{user: "alice", keys: []string{key}, body: "a"})
		require.Equal(t, http.StatusCreated, first.status)
		require.Equal(t, "/orders/committed", first.header.Get("Location"))
		replay := send(t, srv, call{user: "alice", keys: []string{key}, body: "a"})
		require.Equal(t, http.StatusCreated, replay.status)
		require.Equal(t, first.body, replay.body)
		require.EqualValues(t, 1, calls.Load())
	})
}
