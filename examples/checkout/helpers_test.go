package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemguard/idem/internal/testdb"
	"github.com/idemguard/idem/internal/testredis"
	"github.com/idemguard/idem/lock"
)

// runMainEnv makes the test binary behave as the checkout command, so that
// tests can observe its real exit status.
const runMainEnv = "CHECKOUT_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	goleak.VerifyTestMain(m)
}

// strategy is one way of running the service under test.
type strategy struct {
	name string
	args func(t *testing.T) []string
}

var strategies = []strategy{
	{"hybrid-embedded", func(*testing.T) []string {
		return []string{"-strategy", "hybrid", "-redis-addr", "embedded"}
	}},
	{"hybrid-redis", func(t *testing.T) []string {
		testredis.Client(t) // skips, or fails under CI=true, without Redis
		return []string{"-strategy", "hybrid", "-redis-addr", testredis.Addr()}
	}},
	{"table", func(*testing.T) []string {
		return []string{"-strategy", "table"}
	}},
}

// forEachStrategy runs fn in parallel subtests, each against its own server
// started with args.
func forEachStrategy(t *testing.T, fn func(t *testing.T, a *app), args ...string) {
	t.Parallel()
	for _, s := range strategies {
		t.Run("strategy="+s.name, func(t *testing.T) {
			t.Parallel()
			fn(t, start(t, append(s.args(t), args...)...))
		})
	}
}

// app is a running checkout service on its own schema.
type app struct {
	base   string
	client *http.Client
	log    *syncBuffer
	schema string        // set by start
	pool   *pgxpool.Pool // set by start: the test's own connection
}

// testDatabaseURL is TEST_DATABASE_URL with a bounded pool per server.
func testDatabaseURL(t *testing.T) string {
	u, err := url.Parse(testdb.URL())
	require.NoError(t, err)
	q := u.Query()
	q.Set("pool_max_conns", "8")
	u.RawQuery = q.Encode()
	return u.String()
}

// start runs the service on a free port and a schema of its own, with a 20ms
// payment latency, plus args. It is stopped, and must have stopped cleanly,
// when t ends.
func start(t *testing.T, args ...string) *app {
	t.Helper()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t, pool)
	a := startRaw(t, append([]string{
		"-addr", "127.0.0.1:0", "-database-url", testDatabaseURL(t), "-schema", schema, "-work", "20ms",
		"-reconcile-every", "50ms",
	}, args...)...)
	a.schema, a.pool = schema, pool
	return a
}

// startRaw runs the service with exactly args, as the command runs it.
func startRaw(t *testing.T, args ...string) *app {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stdout := newReadyWriter()
	stderr := &syncBuffer{}
	finished := make(chan struct{})
	var runErr error
	go func() {
		defer close(finished)
		runErr = run(ctx, args, stdout, stderr)
	}()
	transport := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(func() {
		transport.CloseIdleConnections()
		cancel()
		select {
		case <-finished:
			require.NoError(t, runErr)
		case <-time.After(30 * time.Second):
			t.Error("the server did not stop within 30s")
		}
		if t.Failed() {
			t.Logf("server log:\n%s", stderr)
		}
	})
	select {
	case addr := <-stdout.addr:
		return &app{base: "http://" + addr, client: &http.Client{Transport: transport, Timeout: 20 * time.Second}, log: stderr}
	case <-finished:
		t.Fatalf("run returned before listening: %v\n%s", runErr, stderr)
	case <-time.After(30 * time.Second):
		t.Fatalf("the server did not start within 30s\n%s", stderr)
	}
	return nil
}

// reply is an HTTP answer, read completely.
type reply struct {
	Status int
	Header http.Header
	Body   []byte
}

// problemType returns the type of a problem+json answer.
func (r reply) problemType(t *testing.T) string {
	t.Helper()
	require.Equal(t, "application/problem+json", r.Header.Get("Content-Type"), "body: %s", r.Body)
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	require.NoError(t, json.Unmarshal(r.Body, &p))
	require.Equal(t, r.Status, p.Status)
	return p.Type
}

func (r reply) replayed() bool { return r.Header.Get("Idempotent-Replayed") == "true" }

// call sends one request. user and key are omitted when empty. It does not
// fail the test, so that it can run on any goroutine.
func (a *app) call(method, path, user, key, body string) (reply, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, a.base+path, rd)
	if err != nil {
		return reply{}, err
	}
	if user != "" {
		req.Header.Set("Authorization", "Bearer "+user)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	return reply{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

func (a *app) do(t *testing.T, method, path, user, key, body string) reply {
	t.Helper()
	r, err := a.call(method, path, user, key, body)
	require.NoError(t, err)
	return r
}

func (a *app) postOrder(t *testing.T, user, key, body string) reply {
	t.Helper()
	return a.do(t, http.MethodPost, "/orders", user, key, body)
}

// charges returns the count of GET /payrail/charges: the charges the
// provider has performed.
func (a *app) charges(t *testing.T) int {
	t.Helper()
	count, _ := a.chargeCounts(t)
	return count
}

// chargeCounts returns what GET /payrail/charges reports: the charges the
// provider has performed (count) and the charge calls it has received,
// replays and refusals included (attempts).
func (a *app) chargeCounts(t *testing.T) (count, attempts int) {
	t.Helper()
	r := a.do(t, http.MethodGet, "/payrail/charges", "", "", "")
	require.Equal(t, http.StatusOK, r.Status)
	var c struct {
		Count    *int `json:"count"`
		Attempts *int `json:"attempts"`
	}
	require.NoError(t, json.Unmarshal(r.Body, &c))
	require.NotNil(t, c.Count, "body: %s", r.Body)
	require.NotNil(t, c.Attempts, "body: %s", r.Body)
	require.GreaterOrEqual(t, *c.Attempts, *c.Count, "every charge was a call; body: %s", r.Body)
	return *c.Count, *c.Attempts
}

// order is the JSON form of an order.
type order struct {
	ID       string  `json:"id"`
	Status   string  `json:"status"`
	HoldIDs  []int64 `json:"hold_ids"`
	ChargeID string  `json:"charge_id"`
}

func decodeOrderReply(t *testing.T, r reply) order {
	t.Helper()
	var o order
	require.NoError(t, json.Unmarshal(r.Body, &o), "body: %s", r.Body)
	return o
}

func newUser() string { return "user-" + strings.ToLower(rand.Text()[:10]) }
func newKey() string  { return rand.Text() }

func orderBody(pm string, holds ...int64) string {
	b, _ := json.Marshal(map[string]any{"hold_ids": holds, "payment_method": pm})
	return string(b)
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// readyWriter is run's stdout: it sends the address of the first
// "listening on http://ADDR" line on addr.
type readyWriter struct {
	syncBuffer
	once sync.Once
	addr chan string
}

var listeningRE = regexp.MustCompile(`listening on http://(\S+)\n`)

func newReadyWriter() *readyWriter { return &readyWriter{addr: make(chan string, 1)} }

func (w *readyWriter) Write(p []byte) (int, error) {
	n, err := w.syncBuffer.Write(p)
	if m := listeningRE.FindStringSubmatch(w.String()); m != nil {
		w.once.Do(func() { w.addr <- m[1] })
	}
	return n, err
}

// deleteLeasesAtCleanup deletes, when t ends, the Redis leases the service
// took for the keys that each names. The service's leases live under its
// own "idem:" prefix, keyed by a hash of (scope, key): random users and keys
// cannot meet another test's. Deleting them beats leaving them to their TTL.
func deleteLeasesAtCleanup(t *testing.T, each func(del func(user, key string))) {
	t.Helper()
	rdb := testredis.Client(t)
	locker, err := lock.New(rdb, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		each(func(user, key string) { rdb.Del(ctx, locker.Key(user, key)) })
	})
}
