package idemclient_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/idemclient"
	"github.com/idemguard/idem/internal/testdb"
)

// seen is one request as it reached the server, before the middleware.
type seen struct {
	key  []string
	body []byte
}

// server is the real middleware over a real PostgreSQL store of the
// test's own, in front of an order handler that counts its runs.
type server struct {
	url  string
	runs atomic.Int32

	mu         sync.Mutex
	seen       []seen
	retryAfter []string // the Retry-After of each answer the server sent, "" for none

	// wrap, when set, may replace the ResponseWriter of the n-th request
	// (from 1) the server gets.
	wrap func(n int, w http.ResponseWriter) http.ResponseWriter
	// block, when set, is waited for by every run of the handler; started
	// gets one value per run, when it begins.
	block   chan struct{}
	started chan struct{}
}

// flakyStore fails the first fails claims, as an unreachable PostgreSQL.
type flakyStore struct {
	idem.Store
	fails atomic.Int32
}

func (s *flakyStore) Claim(ctx context.Context, p idem.ClaimParams) (idem.Record, bool, error) {
	if s.fails.Add(-1) >= 0 {
		return idem.Record{}, false, errors.New("connection refused")
	}
	return s.Store.Claim(ctx, p)
}

// setup starts a server whose first failClaims claims fail (503).
func setup(t *testing.T, failClaims int32, opts ...func(*server)) *server {
	t.Helper()
	store, _ := testdb.Store(t, nil)
	fs := &flakyStore{Store: store}
	fs.fails.Store(failClaims)
	g, err := idem.New(fs, &idem.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	s := &server{started: make(chan struct{}, 16)}
	for _, o := range opts {
		o(s)
	}
	orders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := s.runs.Add(1)
		s.started <- struct{}{}
		if s.block != nil {
			select {
			case <-s.block:
			case <-r.Context().Done():
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
		}
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", n))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"order":%d,"echo":%q}`, n, body)
	})
	guarded := g.Middleware(func(r *http.Request) (string, bool) {
		return strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	}, nil)(orders)
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		r.Body = io.NopCloser(bytes.NewReader(body))
		s.mu.Lock()
		s.seen = append(s.seen, seen{key: r.Header.Values(idem.HeaderKey), body: body})
		s.mu.Unlock()
		n := int(requests.Add(1))
		if s.wrap != nil {
			w = s.wrap(n, w)
		}
		guarded.ServeHTTP(&headerSpy{ResponseWriter: w, s: s}, r)
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

// headerSpy notes the Retry-After of each answer.
type headerSpy struct {
	http.ResponseWriter
	s *server
}

func (h *headerSpy) WriteHeader(code int) {
	h.s.mu.Lock()
	h.s.retryAfter = append(h.s.retryAfter, h.Header().Get("Retry-After"))
	h.s.mu.Unlock()
	h.ResponseWriter.WriteHeader(code)
}

// dropAfterCommit is the ResponseWriter of a connection that breaks once the
// middleware starts to send: after the answer is stored.
type dropAfterCommit struct{ http.ResponseWriter }

func (d dropAfterCommit) WriteHeader(int) {
	conn, _, err := http.NewResponseController(d.ResponseWriter).Hijack()
	if err == nil {
		_ = conn.Close()
	}
}

func (d dropAfterCommit) Write(p []byte) (int, error) { return 0, http.ErrHijacked }

// requireSameAttempts requires n requests at the server, all with the key
// and exactly the body.
func (s *server) requireSameAttempts(t *testing.T, n int, key string, body []byte) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Len(t, s.seen, n)
	for i, a := range s.seen {
		require.Equal(t, []string{key}, a.key, "attempt %d", i+1)
		require.Equal(t, body, a.body, "attempt %d", i+1)
	}
}

// lastRetryAfter is the Retry-After of the server's n-th answer, as a delay.
func (s *server) retryAfterOf(t *testing.T, n int) time.Duration {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Greater(t, len(s.retryAfter), n-1)
	secs, err := strconv.Atoi(s.retryAfter[n-1])
	require.NoError(t, err, "Retry-After %q", s.retryAfter[n-1])
	return time.Duration(secs) * time.Second
}

// clock is a fake clock: every sleep is noted, advances it, and returns at
// once, after calling onSleep if set.
type clock struct {
	mu      sync.Mutex
	now     time.Time
	sleeps  []time.Duration
	onSleep func(n int)
}

func (c *clock) install(tr *idemclient.Transport) {
	idemclient.SetClock(tr, func() time.Time {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.now
	}, func(ctx context.Context, d time.Duration) error {
		c.mu.Lock()
		c.sleeps = append(c.sleeps, d)
		c.now = c.now.Add(d)
		n := len(c.sleeps)
		c.mu.Unlock()
		if c.onSleep != nil {
			c.onSleep(n)
		}
		return ctx.Err()
	})
}

func (c *clock) slept() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}

// newClient returns a client over a Transport of its own, with a fake clock.
func newClient(t *testing.T, cfg *idemclient.Config) (*http.Client, *clock) {
	t.Helper()
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	tr := idemclient.New(base, cfg)
	c := &clock{now: time.Now()}
	c.install(tr)
	return &http.Client{Transport: tr}, c
}

const orderBody = `{"hold_ids":[88211,88212],"payment_method":"pm_card"}`

// order returns a POST /orders of user-1 with body and, when not empty, key.
func order(t *testing.T, ctx context.Context, url, key, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/orders", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer user-1")
	if key != "" {
		req.Header.Set(idem.HeaderKey, key)
	}
	return req
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// The connection breaks after the server stored its answer: the client
// sees no answer, retries with the same key and body, and gets the stored
// answer. The order ran once.
func TestDroppedAfterCommitIsReplayed(t *testing.T) {
	s := setup(t, 0, func(s *server) {
		s.wrap = func(n int, w http.ResponseWriter) http.ResponseWriter {
			if n == 1 {
				return dropAfterCommit{w}
			}
			return w
		}
	})
	client, clk := newClient(t, nil)

	resp, err := client.Do(order(t, t.Context(), s.url, "", orderBody))
	require.NoError(t, err)
	body := readAll(t, resp)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, "/orders/1", resp.Header.Get("Location"))
	require.Contains(t, body, `"order":1`)

	res := idemclient.ResultOf(resp)
	require.True(t, res.Replayed, "the second attempt gets the stored answer")
	require.Equal(t, 2, res.Attempts)
	require.Regexp(t, uuidV4, res.Key)
	require.EqualValues(t, 1, s.runs.Load(), "exactly one execution")
	s.requireSameAttempts(t, 2, res.Key, []byte(orderBody))
	require.Len(t, clk.slept(), 1)
	require.LessOrEqual(t, clk.slept()[0], 200*time.Millisecond, "no Retry-After: the first backoff")
}

// A retry that finds the first request running gets 409, waits the
// Retry-After the server sent, and then gets the stored answer.
func TestInProgressThenReplay(t *testing.T) {
	s := setup(t, 0, func(s *server) { s.block = make(chan struct{}) })
	key := idemclient.NewKey()
	first := make(chan *http.Response, 1)
	go func() {
		resp, err := http.DefaultClient.Do(order(t, t.Context(), s.url, key, orderBody))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		first <- resp
	}()
	<-s.started // the first request runs and holds the key

	client, clk := newClient(t, nil)
	clk.onSleep = func(int) {
		close(s.block)
		r := <-first // its answer is stored before it is sent
		require.NotNil(t, r)
		require.Equal(t, http.StatusCreated, r.StatusCode)
	}
	resp, err := client.Do(order(t, t.Context(), s.url, key, orderBody))
	require.NoError(t, err)
	body := readAll(t, resp)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Contains(t, body, `"order":1`)
	require.Equal(t, idemclient.Result{Key: key, Replayed: true, Attempts: 2}, idemclient.ResultOf(resp))
	require.EqualValues(t, 1, s.runs.Load())
	s.requireSameAttempts(t, 3, key, []byte(orderBody)) // the first request, then the client's two
	require.Equal(t, []time.Duration{s.retryAfterOf(t, 1)}, clk.slept(), "the 409's Retry-After, the server's first answer")
}

// The same key with another body is 422: final, never retried.
func TestKeyReusedIsNotRetried(t *testing.T) {
	s := setup(t, 0)
	key := idemclient.NewKey()
	resp, err := http.DefaultClient.Do(order(t, t.Context(), s.url, key, orderBody))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	readAll(t, resp)

	client, clk := newClient(t, nil)
	resp, err = client.Do(order(t, t.Context(), s.url, key, `{"hold_ids":[1],"payment_method":"pm_card"}`))
	require.NoError(t, err)
	body := readAll(t, resp)
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
	require.Contains(t, body, idem.ProblemKeyReused)
	require.Equal(t, idemclient.Result{Key: key, Attempts: 1}, idemclient.ResultOf(resp))
	require.Empty(t, clk.slept())
	require.EqualValues(t, 1, s.runs.Load())
}

// PostgreSQL is unreachable for the first attempt: 503 with Retry-After;
// the client waits exactly that, and the retry runs the order.
func TestUnavailableHonoursRetryAfter(t *testing.T) {
	s := setup(t, 1)
	client, clk := newClient(t, nil)
	key := idemclient.NewKey()
	resp, err := client.Do(order(t, t.Context(), s.url, key, orderBody))
	require.NoError(t, err)
	readAll(t, resp)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, idemclient.Result{Key: key, Attempts: 2}, idemclient.ResultOf(resp))
	require.EqualValues(t, 1, s.runs.Load())
	s.requireSameAttempts(t, 2, key, []byte(orderBody))
	wait := s.retryAfterOf(t, 1)
	require.GreaterOrEqual(t, wait, 2*time.Second, "the 503's hint: 2s plus jitter")
	require.Equal(t, []time.Duration{wait}, clk.slept())
}

// A key that stays in progress: the retries end at the request's deadline,
// before a wait that would outlast it, with an error that wraps
// context.DeadlineExceeded and names the key.
func TestDeadlineEndsTheRetries(t *testing.T) {
	s := setup(t, 0, func(s *server) { s.block = make(chan struct{}) })
	t.Cleanup(func() { close(s.block) })
	key := idemclient.NewKey()
	go func() {
		if resp, err := http.DefaultClient.Do(order(t, t.Context(), s.url, key, orderBody)); err == nil {
			_ = resp.Body.Close()
		}
	}()
	<-s.started

	client, clk := newClient(t, &idemclient.Config{Retry: idemclient.Retry{MaxAttempts: 100, MaxElapsed: time.Hour}})
	deadline := time.Now().Add(time.Minute)
	clk.now = deadline.Add(-5 * time.Second) // the fake clock: 5s before the deadline
	ctx, cancel := context.WithDeadline(t.Context(), deadline)
	defer cancel()
	resp, err := client.Do(order(t, ctx, s.url, key, orderBody))
	require.Nil(t, resp)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var e *idemclient.Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, key, e.Key)
	slept := clk.slept()
	require.Equal(t, len(slept)+1, e.Attempts)
	var total time.Duration
	for _, d := range slept {
		total += d
	}
	require.Less(t, total, 5*time.Second, "no wait past the deadline")
	require.GreaterOrEqual(t, e.Attempts, 2)
	require.EqualValues(t, 1, s.runs.Load())
	s.requireSameAttempts(t, e.Attempts+1, key, []byte(orderBody))
	require.NotContains(t, err.Error(), "\n")
}

// The deadline passes while an attempt waits for its answer.
func TestDeadlineDuringAnAttempt(t *testing.T) {
	s := setup(t, 0, func(s *server) { s.block = make(chan struct{}) }) // never closed: runs until the client leaves
	client, _ := newClient(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	resp, err := client.Do(order(t, ctx, s.url, "", orderBody))
	require.Nil(t, resp)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var e *idemclient.Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, 1, e.Attempts)
	require.Regexp(t, uuidV4, e.Key)
}

// What cannot be sent as the server would take it is refused before
// anything is sent.
func TestRefusedBeforeSending(t *testing.T) {
	s := setup(t, 0)
	client, _ := newClient(t, &idemclient.Config{MaxBody: 16})
	for name, tc := range map[string]struct {
		req  func() *http.Request
		want error
	}{
		"a list of keys": {func() *http.Request { return order(t, t.Context(), s.url, "a, b", "{}") }, idemclient.ErrKeyInvalid},
		"two key fields": {func() *http.Request {
			r := order(t, t.Context(), s.url, "a", "{}")
			r.Header.Add(idem.HeaderKey, "b")
			return r
		}, idemclient.ErrKeyInvalid},
		"a key too long":   {func() *http.Request { return order(t, t.Context(), s.url, strings.Repeat("k", 256), "{}") }, idemclient.ErrKeyInvalid},
		"a body too large": {func() *http.Request { return order(t, t.Context(), s.url, "", strings.Repeat("x", 17)) }, idemclient.ErrBodyTooLarge},
		"a body of unknown length too large": {func() *http.Request {
			r := order(t, t.Context(), s.url, "", "")
			r.Body, r.ContentLength = io.NopCloser(strings.NewReader(strings.Repeat("x", 17))), -1
			return r
		}, idemclient.ErrBodyTooLarge},
		"a body that fails": {func() *http.Request {
			r := order(t, t.Context(), s.url, "", "")
			pr, pw := io.Pipe()
			pw.CloseWithError(errors.New("disk gone"))
			r.Body, r.ContentLength = pr, -1
			return r
		}, idemclient.ErrBodyNotReplayable},
		"a body shorter than declared": {func() *http.Request {
			r := order(t, t.Context(), s.url, "", "{}")
			r.ContentLength = 5
			return r
		}, idemclient.ErrBodyNotReplayable},
	} {
		t.Run(name, func(t *testing.T) {
			resp, err := client.Transport.RoundTrip(tc.req())
			require.Nil(t, resp)
			require.ErrorIs(t, err, tc.want)
			var e *idemclient.Error
			require.False(t, errors.As(err, &e), "nothing was sent: not an *Error")
			require.NotContains(t, err.Error(), "\n")
		})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Empty(t, s.seen, "nothing sent")
}

// A caller's quoted key (RFC 8941) is sent as written, and reported
// unquoted, as the server reads it.
func TestCallersKeyIsKept(t *testing.T) {
	s := setup(t, 0)
	client, _ := newClient(t, nil)
	resp, err := client.Do(order(t, t.Context(), s.url, `"intent 42"`, orderBody))
	require.NoError(t, err)
	readAll(t, resp)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, idemclient.Result{Key: "intent 42", Attempts: 1}, idemclient.ResultOf(resp))
	s.requireSameAttempts(t, 1, `"intent 42"`, []byte(orderBody))
}

// A GET without a key is not guarded: one attempt, no key, even for a 503.
func TestUnguardedPassesThrough(t *testing.T) {
	var got atomic.Int32
	var keys atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		keys.Add(int32(len(r.Header.Values(idem.HeaderKey))))
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	client, clk := newClient(t, nil)
	resp, err := client.Get(srv.URL)
	require.NoError(t, err)
	readAll(t, resp)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, idemclient.Result{}, idemclient.ResultOf(resp))
	require.EqualValues(t, 1, got.Load())
	require.Zero(t, keys.Load())
	require.Empty(t, clk.slept())
}

// Retries end at MaxAttempts with the last answer, which the caller can
// still read; a 409 of another kind than in progress is final.
func TestMaxAttemptsReturnsTheLastAnswer(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		if n.Add(1) > 3 {
			w.WriteHeader(http.StatusConflict) // a handler's own 409
			_, _ = w.Write([]byte(`{"type":"https://example.com/probs#out-of-stock","status":409}`))
			return
		}
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusConflict)
		_, _ = w.Write([]byte(`{"type":"https://example.com/problems/request-in-progress","status":409}`))
	}))
	t.Cleanup(srv.Close)

	client, clk := newClient(t, &idemclient.Config{Retry: idemclient.Retry{MaxAttempts: 2}})
	resp, err := client.Do(order(t, t.Context(), srv.URL, "k1", "{}"))
	require.NoError(t, err)
	require.Contains(t, readAll(t, resp), "request-in-progress")
	require.Equal(t, idemclient.Result{Key: "k1", Attempts: 2}, idemclient.ResultOf(resp))
	require.Equal(t, []time.Duration{time.Second}, clk.slept())

	client, clk = newClient(t, nil)
	resp, err = client.Do(order(t, t.Context(), srv.URL, "k2", "{}"))
	require.NoError(t, err)
	require.Contains(t, readAll(t, resp), "out-of-stock", "the 409 is the answer")
	require.Equal(t, idemclient.Result{Key: "k2", Attempts: 2}, idemclient.ResultOf(resp))
	require.Len(t, clk.slept(), 1)
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		v    string
		want time.Duration
	}{
		{"", 0},
		{"0", 0},
		{"3", 3 * time.Second},
		{"-3", 0},
		{"1.5", 0},
		{"soon", 0},
		{"99999999999999", 24 * time.Hour},
		{"Thu, 03 Dec 2026 12:00:07 GMT", 7 * time.Second},
		{"Thu, 03 Dec 2026 11:59:00 GMT", 0},
	} {
		require.Equal(t, tc.want, idemclient.RetryAfter(tc.v, now), "%q", tc.v)
	}
}

func TestNewKey(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		k := idemclient.NewKey()
		require.Regexp(t, uuidV4, k)
		_, err := idem.ParseKey([]string{k})
		require.NoError(t, err)
		require.False(t, seen[k])
		seen[k] = true
	}
}

func TestNewPanicsOnNegativeConfig(t *testing.T) {
	require.PanicsWithValue(t, "idemclient: Config.MaxBody -1 must not be negative", func() {
		idemclient.New(nil, &idemclient.Config{MaxBody: -1})
	})
	require.PanicsWithValue(t, "idemclient: Config.Retry.MaxAttempts -1 must not be negative", func() {
		idemclient.New(nil, &idemclient.Config{Retry: idemclient.Retry{MaxAttempts: -1}})
	})
}

type idleCounter struct {
	http.RoundTripper
	closed atomic.Int32
}

func (c *idleCounter) CloseIdleConnections() { c.closed.Add(1) }

func TestCloseIdleConnectionsReachesTheBase(t *testing.T) {
	base := &idleCounter{RoundTripper: http.DefaultTransport}
	(&http.Client{Transport: idemclient.New(base, nil)}).CloseIdleConnections()
	require.EqualValues(t, 1, base.closed.Load())
}

// answer is one scripted answer of a fake server.
type answer struct {
	status int
	header map[string]string
	body   string
}

// TestWhatIsRetried walks the retry table against a scripted server: each
// case's answers are given in turn, and the client must stop at the first
// final one.
func TestWhatIsRetried(t *testing.T) {
	problem := func(slug string) string { return `{"type":"` + idem.ProblemBase + slug + `"}` }
	pj := map[string]string{"Content-Type": "application/problem+json"}
	inProgress := answer{409, map[string]string{"Content-Type": "application/problem+json; charset=utf-8", "Retry-After": "1"}, problem(idem.ProblemInProgress)}
	pending := answer{409, map[string]string{"Content-Type": "application/problem+json", "Retry-After": "2"}, problem(idem.ProblemPending)}
	created := answer{201, nil, "{}"}
	for name, tc := range map[string]struct {
		method   string
		answers  []answer
		attempts int
		keyed    bool
		sleeps   []time.Duration
	}{
		"201":                  {"POST", []answer{created}, 1, true, nil},
		"409 in progress, 201": {"POST", []answer{inProgress, created}, 2, true, []time.Duration{time.Second}},
		"409 pending, 201":     {"POST", []answer{pending, created}, 2, true, []time.Duration{2 * time.Second}},
		"409 of the handler":   {"POST", []answer{{409, pj, problem("out-of-stock")}}, 1, true, nil},
		"409 not a problem":    {"POST", []answer{{409, nil, problem(idem.ProblemInProgress)}}, 1, true, nil},
		"429 at a date, 201": {"POST", []answer{{429, map[string]string{
			"Retry-After": "in 10s"}, ""}, created}, 2, true, nil},
		"500, 502, 201":              {"PATCH", []answer{{500, nil, ""}, {502, nil, ""}, created}, 3, true, nil},
		"422":                        {"POST", []answer{{422, pj, problem(idem.ProblemKeyReused)}}, 1, true, nil},
		"400 key invalid":            {"POST", []answer{{400, pj, problem(idem.ProblemKeyInvalid)}}, 1, true, nil},
		"404":                        {"POST", []answer{{404, nil, ""}}, 1, true, nil},
		"a replayed 409 is final":    {"POST", []answer{{409, map[string]string{idem.HeaderReplayed: "true", "Content-Type": "application/problem+json"}, problem(idem.ProblemInProgress)}}, 1, true, nil},
		"PUT without a key: once":    {"PUT", []answer{{503, nil, ""}}, 1, false, nil},
		"five 503s: the last answer": {"POST", []answer{{503, nil, ""}, {503, nil, ""}, {503, nil, ""}, {503, nil, ""}, {503, nil, ""}, created}, 5, true, nil},
	} {
		t.Run(name, func(t *testing.T) {
			var n atomic.Int32
			var keys sync.Map
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				keys.Store(r.Header.Get(idem.HeaderKey), true)
				a := tc.answers[n.Add(1)-1]
				for k, v := range a.header {
					if v == "in 10s" { // an HTTP date, made when it is sent
						v = time.Now().Add(10 * time.Second).UTC().Format(http.TimeFormat)
					}
					w.Header().Set(k, v)
				}
				w.WriteHeader(a.status)
				_, _ = io.WriteString(w, a.body)
			}))
			t.Cleanup(srv.Close)
			client, clk := newClient(t, nil)
			req, err := http.NewRequestWithContext(t.Context(), tc.method, srv.URL, strings.NewReader("{}"))
			require.NoError(t, err)
			resp, err := client.Do(req)
			require.NoError(t, err)
			body := readAll(t, resp)
			last := tc.answers[tc.attempts-1]
			require.Equal(t, last.status, resp.StatusCode)
			require.Equal(t, last.body, body, "the caller reads the answer in full")
			require.EqualValues(t, tc.attempts, n.Load())
			res := idemclient.ResultOf(resp)
			if !tc.keyed {
				require.Equal(t, idemclient.Result{}, res)
				return
			}
			require.Equal(t, tc.attempts, res.Attempts)
			count := 0
			keys.Range(func(k, _ any) bool {
				count++
				require.Equal(t, res.Key, k)
				return true
			})
			require.Equal(t, 1, count, "one key for every attempt")
			slept := clk.slept()
			require.Len(t, slept, tc.attempts-1)
			if tc.sleeps != nil {
				require.Equal(t, tc.sleeps, slept)
			}
			if strings.HasPrefix(name, "429 at a date") {
				require.GreaterOrEqual(t, slept[0], 9*time.Second, "the date, to the second")
				require.Less(t, slept[0], 20*time.Second, "the date, from the fake clock set before the request")
			}
		})
	}
}

// A Retry-After past MaxElapsed ends the retries at once, with that answer.
func TestRetryAfterPastMaxElapsedEndsTheRetries(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Retry-After", "3600")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	t.Cleanup(srv.Close)
	client, clk := newClient(t, nil)
	resp, err := client.Post(srv.URL, "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	readAll(t, resp)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.Equal(t, 1, idemclient.ResultOf(resp).Attempts)
	require.EqualValues(t, 1, n.Load())
	require.Empty(t, clk.slept())
}
