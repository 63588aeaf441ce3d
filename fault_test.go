package idem_test

// Fault injection: concurrent traffic, with retries of the same intents, runs
// through the Guard (guard.Do and the middleware over httptest) while a real
// PostgreSQL or Redis is killed, slowed, cut, refused or times out. After
// each scenario the test counts executions per intent, checks that every
// answer a client received as final replays unchanged, that no 500 escaped,
// and that the guard serves fresh intents again without a restart. It prints
// one RELIABILITY line of figures per scenario (go test -run TestFault -v).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/faultproxy"
	"github.com/idemguard/idem/internal/heavy"
	"github.com/idemguard/idem/internal/tempserver"
	"github.com/idemguard/idem/internal/testdb"
	"github.com/idemguard/idem/internal/testredis"
	"github.com/idemguard/idem/lock"
)

// Timing of the guards under fault: short enough that a lease left behind by
// a failed store expires within the test.
const (
	faultLeaseTTL     = 2 * time.Second
	faultStoreTimeout = time.Second
	faultWorkTimeout  = 500 * time.Millisecond
	faultWorkTime     = 15 * time.Millisecond
)

// The Redis scenarios use a longer lease, so that a slow payment call (1.2s)
// outlives the lock's 500ms timeout: a retry that finds Redis gone falls back
// while the lease holder still runs, which is the documented window.
const (
	redisLeaseTTL    = 5 * time.Second
	redisWorkTimeout = 2 * time.Second
	slowWorkTime     = 1200 * time.Millisecond
)

// ---- the rig -------------------------------------------------------------

// intent is one client intent: one (scope, key, body), sent until it gets a
// final answer, sometimes by two senders at once.
type intent struct {
	scope, key, body string
	fp               idem.Fingerprint
	declined         bool // the work answers 402 (a final 4xx, stored)
	slowStore        bool // the answer carries the marker the slow-store trigger looks for
	crash            bool // the process "dies" between the work and the store
	leaseExpiry      bool // the lease expires while the work runs
	slow             bool // the work takes slowWorkTime (a slow payment provider)
	twin             bool // a second sender sends it at the same time

	mu     sync.Mutex
	execs  []execRecord
	finals []view
}

// execRecord is one execution of the work for an intent.
type execRecord struct {
	start, end time.Time
	charged    bool // the work completed (not cut by its deadline)
	answer     idem.Response
}

// view is what a client compares: status, Location and body.
type view struct {
	status   int
	location string
	body     string
}

func (v view) final() bool {
	return v.status >= 200 && v.status < 500 && v.status != http.StatusConflict && v.status != http.StatusTooManyRequests
}

func (in *intent) charged() []execRecord {
	in.mu.Lock()
	defer in.mu.Unlock()
	var out []execRecord
	for _, e := range in.execs {
		if e.charged {
			out = append(out, e)
		}
	}
	return out
}

// faultStore wraps the real store: it records the keys whose answer could
// not be stored, and fails the store of "crash" intents, as a process that
// dies between the work and the store.
type faultStore struct {
	idem.Store
	crash      func(scope, key string) bool
	lostStores sync.Map // scope\x00key -> true
	crashes    atomic.Int64
}

var errProcessDied = errors.New("process died before storing the answer")

func (s *faultStore) Complete(ctx context.Context, scope, key string, owner idem.Token, a idem.Response) error {
	err := s.fail(ctx, scope, key)
	if err == nil {
		err = s.Store.Complete(ctx, scope, key, owner, a)
	}
	if err != nil {
		s.lostStores.Store(scope+"\x00"+key, true)
	}
	return err
}

func (s *faultStore) fail(_ context.Context, scope, key string) error {
	if s.crash == nil || !s.crash(scope, key) {
		return nil
	}
	s.crashes.Add(1)
	// What a dying process leaves: a store call cancelled before it landed.
	return errors.Join(errProcessDied, context.Canceled)
}

func (s *faultStore) lost(in *intent) bool {
	_, ok := s.lostStores.Load(in.scope + "\x00" + in.key)
	return ok
}

// rig drives one or more guard instances (as separate service instances
// sharing one PostgreSQL table) with concurrent traffic; each request goes
// to the next instance in turn.
type rig struct {
	t        *testing.T
	strategy string // "table", "hybrid", or "mixed" for a fleet of both
	insts    []*instance
	next     atomic.Int64
	guard    *idem.Guard // the first instance's, for settling and stats
	store    *faultStore
	mr       *miniredis.Miniredis // hybrid on miniredis only

	intents sync.Map // scope\x00key -> *intent
	charges atomic.Int64
	ledger  sync.Map                                     // scope\x00key -> charge: the provider's record, by the key derived from the intent
	onWork  func(ctx context.Context, in *intent, n int) // runs inside the work, before it completes

	requests   atomic.Int64
	served500  atomic.Int64
	status503  atomic.Int64
	status409  atomic.Int64
	transport  atomic.Int64 // requests that got no HTTP answer
	unexpected sync.Map     // description -> count
}

// instance is one service instance: a guard and its HTTP server.
type instance struct {
	guard  *idem.Guard
	srv    *httptest.Server
	client *http.Client
}

type rigOpts struct {
	strategy string
	pool     *pgxpool.Pool         // required
	dbcfg    *durable.Config       // schema etc.
	redis    redis.UniversalClient // hybrid
	prefix   string
	mr       *miniredis.Miniredis
	crash    func(scope, key string) bool
	leaseTTL time.Duration // defaults to faultLeaseTTL
	workTO   time.Duration // defaults to faultWorkTimeout
	// peers are further instances over the same table: each is a lock
	// client (nil: table strategy). A request goes to each instance in turn.
	peers []redis.UniversalClient
	// peerTable adds one instance on the table strategy: a fleet in the
	// middle of a rolling deploy from one strategy to the other.
	peerTable bool
}

func newRig(t *testing.T, o rigOpts) *rig {
	t.Helper()
	ds, err := durable.New(o.pool, o.dbcfg)
	require.NoError(t, err)
	fs := &faultStore{Store: ds, crash: o.crash}
	if o.leaseTTL == 0 {
		o.leaseTTL, o.workTO = faultLeaseTTL, faultWorkTimeout
	}
	r := &rig{t: t, strategy: o.strategy, store: fs, mr: o.mr}
	var first redis.UniversalClient
	if o.strategy == "hybrid" || o.strategy == "mixed" {
		first = o.redis // "mixed": this hybrid instance, plus the table peer
	}
	clients := append([]redis.UniversalClient{first}, o.peers...)
	if o.peerTable {
		clients = append(clients, nil)
	}
	for _, c := range clients {
		cfg := &idem.Config{
			StoreTimeout: faultStoreTimeout,
			WorkTimeout:  o.workTO,
			Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		}
		if c != nil {
			l, err := lock.New(c, &lock.Config{Prefix: o.prefix, TTL: o.leaseTTL})
			require.NoError(t, err)
			cfg.Lock = l
		}
		g, err := idem.New(fs, cfg)
		require.NoError(t, err)
		in := &instance{guard: g}
		in.srv = httptest.NewServer(g.Middleware(bearerScope, nil)(http.HandlerFunc(r.serveHTTP)))
		t.Cleanup(in.srv.Close)
		in.client = &http.Client{Transport: in.srv.Client().Transport, Timeout: 5 * time.Second}
		t.Cleanup(in.client.CloseIdleConnections)
		r.insts = append(r.insts, in)
	}
	r.guard = r.insts[0].guard
	return r
}

// pick returns the instance the next request goes to.
func (r *rig) pick() *instance {
	return r.insts[int(r.next.Add(1))%len(r.insts)]
}

// stats adds up the instances' counters.
func (r *rig) stats() (s idem.Stats) {
	for _, in := range r.insts {
		x := in.guard.Stats()
		s.Fallbacks += x.Fallbacks
		s.DoubleExecutions += x.DoubleExecutions
		s.StoreErrors += x.StoreErrors
		s.Executed += x.Executed
		s.InProgress += x.InProgress
	}
	return s
}

func (r *rig) newIntent(i int) *intent {
	in := &intent{scope: fmt.Sprintf("user-%d", i%7), key: newKey()}
	in.declined = i%9 == 4
	in.body = fmt.Sprintf(`{"hold_ids":[%d],"payment_method":"pm_%d"}`, 88000+i, i)
	in.fp = idem.HashRequest(http.MethodPost, "/orders", []byte(in.body))
	return in
}

func (r *rig) register(in *intent) {
	r.intents.Store(in.scope+"\x00"+in.key, in)
}

// work is the guarded operation: a charge that takes faultWorkTime and
// honours its deadline (cut: nothing charged, 504, the key stays in progress).
func (r *rig) work(ctx context.Context, in *intent) idem.Response {
	in.mu.Lock()
	n := len(in.execs)
	in.execs = append(in.execs, execRecord{start: time.Now()})
	in.mu.Unlock()
	if r.onWork != nil {
		r.onWork(ctx, in, n)
	}
	d := faultWorkTime
	if in.slow {
		d = slowWorkTime
	}
	t := time.NewTimer(d)
	defer t.Stop()
	var resp idem.Response
	charged := false
	select {
	case <-ctx.Done():
		resp = idem.Response{Status: http.StatusGatewayTimeout, Header: http.Header{}, Body: []byte("payment provider timeout")}
	case <-t.C:
		charged = true
		c := charge{id: r.charges.Add(1), declined: in.declined}
		r.ledger.Store(in.scope+"\x00"+in.key, c)
		resp = r.render(in, c)
	}
	in.mu.Lock()
	in.execs[n].end, in.execs[n].charged, in.execs[n].answer = time.Now(), charged, resp
	in.mu.Unlock()
	return resp
}

// charge is what the provider records of a charge, by the intent's key: all
// a resolver has to rebuild the answer from.
type charge struct {
	id       int64
	declined bool
}

// render is the answer of a charge, as the work gives it and a resolver
// rebuilds it.
func (r *rig) render(in *intent, c charge) idem.Response {
	note := ""
	if in.slowStore {
		note = `,"note":"slow-store"`
	}
	if c.declined {
		return idem.Response{Status: http.StatusPaymentRequired,
			Header: http.Header{"Content-Type": {"application/problem+json"}},
			Body:   fmt.Appendf(nil, `{"title":"card declined","attempt":%d%s}`, c.id, note)}
	}
	return idem.Response{Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {fmt.Sprintf("/orders/%d", c.id)}},
		Body:   fmt.Appendf(nil, `{"order":%d,"key":%q%s}`, c.id, in.key, note)}
}

func (r *rig) serveHTTP(w http.ResponseWriter, req *http.Request) {
	scope, _ := bearerScope(req)
	v, ok := r.intents.Load(scope + "\x00" + req.Header.Get(idem.HeaderKey))
	if !ok {
		http.Error(w, "unknown intent", http.StatusBadRequest)
		return
	}
	_, _ = io.ReadAll(req.Body)
	resp := r.work(req.Context(), v.(*intent))
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

func (r *rig) note(what string) {
	v, _ := r.unexpected.LoadOrStore(what, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

// send sends the intent once, over HTTP through the middleware or through
// guard.Do, and returns what the client saw (status 0: no HTTP answer).
func (r *rig) send(ctx context.Context, in *intent, viaHTTP bool) view {
	r.requests.Add(1)
	var v view
	if viaHTTP {
		v = r.sendHTTP(ctx, in)
	} else {
		v = r.sendDo(ctx, in)
	}
	switch v.status {
	case 0:
		r.transport.Add(1)
	case http.StatusInternalServerError:
		r.served500.Add(1)
	case http.StatusServiceUnavailable:
		r.status503.Add(1)
	case http.StatusConflict:
		r.status409.Add(1)
	case http.StatusUnprocessableEntity, http.StatusBadRequest:
		r.note(fmt.Sprintf("status %d", v.status))
	}
	return v
}

func (r *rig) sendHTTP(ctx context.Context, in *intent) view {
	inst := r.pick()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, inst.srv.URL+"/orders", strings.NewReader(in.body))
	if err != nil {
		panic(err)
	}
	req.Header.Set("Authorization", "Bearer "+in.scope)
	req.Header.Set(idem.HeaderKey, in.key)
	resp, err := inst.client.Do(req)
	if err != nil {
		return view{}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return view{}
	}
	return view{status: resp.StatusCode, location: resp.Header.Get("Location"), body: string(body)}
}

func (r *rig) sendDo(ctx context.Context, in *intent) view {
	resp, out, err := r.pick().guard.Do(ctx, idem.Request{Scope: in.scope, Key: in.key, Fingerprint: in.fp},
		func(ctx context.Context) (idem.Response, error) { return r.work(ctx, in), nil })
	switch {
	case out == idem.OutcomeInProgress:
		return view{status: http.StatusConflict}
	case out == idem.OutcomeKeyReused:
		return view{status: http.StatusUnprocessableEntity}
	case out == idem.OutcomeNone && errors.Is(err, idem.ErrUnavailable):
		return view{status: http.StatusServiceUnavailable}
	case out == idem.OutcomeNone:
		r.note(fmt.Sprintf("Do: %v", err))
		return view{status: http.StatusInternalServerError}
	}
	return view{status: resp.Status, location: resp.Header.Get("Location"), body: string(resp.Body)}
}

// drive sends the intent until it gets a final answer or until deadline,
// backing off 20-50ms between attempts. It reports whether it got one.
func (r *rig) drive(ctx context.Context, in *intent, viaHTTP bool, deadline time.Time) bool {
	for attempt := 0; ; attempt++ {
		v := r.send(ctx, in, viaHTTP)
		if v.final() {
			in.mu.Lock()
			in.finals = append(in.finals, v)
			in.mu.Unlock()
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(time.Duration(20+(attempt*7)%30) * time.Millisecond)
	}
}

// load runs workers for d: each takes fresh intents one after the other and
// drives each to a final answer (for at most 1.5s); every third intent gets
// a second sender at once, through the other path. fault runs alongside and
// returns when the fault is cleared; from then on load also probes with fresh
// intents and returns how long the guard took to serve one (0 without fault).
// load returns every intent it created.
func (r *rig) load(workers int, d time.Duration, mark func(i int, in *intent), fault func()) ([]*intent, time.Duration) {
	var (
		mu      sync.Mutex
		all     []*intent
		wg      sync.WaitGroup
		counter atomic.Int64
	)
	ctx := context.Background()
	stop := time.Now().Add(d)
	for w := range workers {
		wg.Go(func() {
			for time.Now().Before(stop) {
				i := int(counter.Add(1))
				in := r.newIntent(i)
				in.twin = i%3 == 0
				if mark != nil {
					mark(i, in)
				}
				r.register(in)
				mu.Lock()
				all = append(all, in)
				mu.Unlock()
				deadline := time.Now().Add(3 * time.Second)
				var twin sync.WaitGroup
				if in.twin {
					twin.Go(func() { r.drive(ctx, in, w%2 == 1, deadline) })
				}
				r.drive(ctx, in, w%2 == 0, deadline)
				twin.Wait()
			}
		})
	}
	var recovered time.Duration
	if fault != nil {
		fault()
		cleared := time.Now()
		for i := 0; recovered == 0 && time.Since(cleared) < 10*time.Second; i++ {
			in := r.newIntent(1_000_000 + i)
			r.register(in)
			mu.Lock()
			all = append(all, in)
			mu.Unlock()
			if r.drive(ctx, in, i%2 == 0, time.Now()) {
				recovered = time.Since(cleared)
			} else {
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	wg.Wait()
	return all, recovered
}

// figures are one scenario's results, printed as one RELIABILITY line.
type figures struct {
	scenario, strategy string
	requests           int64
	faults             int
	intents            int
	executions         int
	maxExec            int
	doubles            int    // intents charged more than once (the test fails)
	settled, released  int    // pending keys the reconciler settled or released
	answersLost        int    // intents whose replay is not the answer of their one charge
	diverged           int    // final answers a client was told that the replay contradicts
	detected           uint64 // Stats.DoubleExecutions: claims found taken over after the work
	lostStores         int    // intents whose answer could not be stored after the work
	served500          int64
	status503          int64
	status409          int64
	fallbacks          uint64
	recovered          time.Duration // from the fault's end to the first fresh intent answered
}

func (f figures) log(t *testing.T) {
	t.Helper()
	recovered := "n/a"
	if f.recovered > 0 {
		recovered = f.recovered.Round(time.Millisecond).String()
	}
	t.Logf("RELIABILITY scenario=%-22s strategy=%-6s requests=%5d faults=%3d intents=%4d executions=%4d max_exec_per_intent=%d double_exec=%d (detected=%d) answers_lost=%d answers_diverged=%d stores_failed=%d settled=%d released=%d http_409=%d http_500=%d http_503=%d fallbacks=%d recovered_in=%s",
		f.scenario, f.strategy, f.requests, f.faults, f.intents, f.executions, f.maxExec, f.doubles, f.detected,
		f.answersLost, f.diverged, f.lostStores, f.settled, f.released, f.status409, f.served500, f.status503, f.fallbacks, recovered)
}

// finish drives every unfinished intent again for up to budget (the fault is
// over), reconciles the keys still in progress the way a reconciler would
// (settle with the answer rebuilt from the provider's record of the charge,
// or release when nothing was charged), then replays every intent and checks it against what
// clients were told. An intent that ran twice, or an answer a client was
// told that its replay contradicts, fails the test.
func (r *rig) finish(t *testing.T, f *figures, all []*intent, budget time.Duration) {
	t.Helper()
	ctx := context.Background()
	parallel := func(fn func(i int, in *intent)) {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		for i, in := range all {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				fn(i, in)
			})
		}
		wg.Wait()
	}
	// 1. Clients retry what they never got an answer for.
	deadline := time.Now().Add(budget)
	parallel(func(i int, in *intent) {
		in.mu.Lock()
		done := len(in.finals) > 0
		in.mu.Unlock()
		if !done {
			r.drive(ctx, in, i%2 == 0, deadline)
		}
	})

	// 2. A reconciler settles or releases what is still in progress.
	var settled, released atomic.Int64
	errs := make([]error, len(all))
	parallel(func(i int, in *intent) {
		if r.send(ctx, in, false).final() {
			return
		}
		rec, err := r.store.Get(ctx, in.scope, in.key)
		if errors.Is(err, idem.ErrNotFound) {
			return // released or never claimed: the next retry runs
		}
		if err != nil {
			errs[i] = fmt.Errorf("read %s: %w", in.key, err)
			return
		}
		owner := rec.Owner
		// As a real resolver does: ask the provider, and rebuild the
		// answer from its record, never from what a client was told.
		if c, ok := r.ledger.Load(in.scope + "\x00" + in.key); ok {
			if err := r.guard.Settle(ctx, in.scope, in.key, owner, r.render(in, c.(charge))); err != nil {
				errs[i] = fmt.Errorf("settle %s: %w", in.key, err)
			} else {
				settled.Add(1)
			}
			return
		}
		if err := r.guard.Release(ctx, in.scope, in.key, owner); err != nil {
			errs[i] = fmt.Errorf("release %s: %w", in.key, err)
		}
		released.Add(1)
	})
	require.NoError(t, errors.Join(errs...))
	f.settled, f.released = int(settled.Load()), int(released.Load())

	// 3. Every intent now replays (or, released, runs once more).
	replays := make([]view, len(all))
	deadline = time.Now().Add(budget)
	parallel(func(i int, in *intent) {
		for {
			replays[i] = r.send(ctx, in, i%2 == 1)
			if replays[i].final() || time.Now().After(deadline) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	for i, in := range all {
		v := replays[i]
		require.True(t, v.final(), "intent %s has no final answer after reconciliation: %d", in.key, v.status)
		ch := in.charged()
		f.executions += len(ch)
		f.maxExec = max(f.maxExec, len(ch))
		if len(ch) > 1 {
			f.doubles++
			t.Errorf("intent %s charged %d times", in.key, len(ch))
		}
		in.mu.Lock()
		finals := append([]view(nil), in.finals...)
		in.mu.Unlock()
		for _, got := range finals {
			if got != v {
				f.diverged++
				t.Errorf("intent %s: a client was told %d %q, the replay is %d %q", in.key, got.status, got.body, v.status, v.body)
			}
		}
		if len(finals) == 0 && len(ch) == 1 {
			// Nobody was told; the replay must be the one charge's answer.
			a := ch[0].answer
			if v.status != a.Status || v.body != string(a.Body) {
				f.answersLost++
				t.Errorf("intent %s: replay %d %q is not the charge's answer %d %q", in.key, v.status, v.body, a.Status, a.Body)
			}
		}
	}
	f.intents = len(all)
	for _, in := range all {
		if r.store.lost(in) {
			f.lostStores++
		}
	}
	f.requests = r.requests.Load()
	f.served500 = r.served500.Load()
	f.status503 = r.status503.Load()
	f.status409 = r.status409.Load()
	st := r.stats()
	f.fallbacks, f.detected = st.Fallbacks, st.DoubleExecutions
	require.Zero(t, f.served500, "no 500 may escape: store and lock faults are 503 or 409")
	require.Zero(t, f.doubles, "no intent may run twice: every execution holds its durable row")
	require.Zero(t, f.diverged, "no client may be told an answer other than the stored one")
	r.unexpected.Range(func(k, v any) bool {
		t.Errorf("unexpected: %s (x%d)", k, v.(*atomic.Int64).Load())
		return true
	})
}

// fresh checks that, the fault over, ten fresh intents are each served on
// their first attempt and run once.
func (r *rig) fresh(t *testing.T) {
	t.Helper()
	for i := range 10 {
		in := r.newIntent(2_000_000 + i)
		r.register(in)
		v := r.send(context.Background(), in, i%2 == 0)
		require.True(t, v.final(), "fresh intent after the fault: %d %s", v.status, v.body)
		require.Len(t, in.charged(), 1)
	}
}

// overlapped reports whether an execution of in that was charged overlapped
// [from, to] (widened by slack on both sides).
func overlapped(in *intent, from, to time.Time, slack time.Duration) bool {
	for _, e := range in.charged() {
		if e.start.Before(to.Add(slack)) && e.end.After(from.Add(-slack)) {
			return true
		}
	}
	return false
}

// ---- environments ------------------------------------------------------

// sharedPG gives a migrated schema on the test PostgreSQL, and a pool.
func sharedPG(t *testing.T) (*pgxpool.Pool, *durable.Config) {
	t.Helper()
	pool := testdb.Pool(t)
	cfg := &durable.Config{Schema: testdb.Schema(t, pool), AdmissionWait: time.Minute} // see testdb.Store
	require.NoError(t, durable.Migrate(t.Context(), pool, cfg))
	return pool, cfg
}

// poolFor opens a pool on url with a 1s connect timeout, closed at cleanup.
func poolFor(t *testing.T, url string, params map[string]string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.ConnectTimeout = time.Second
	cfg.MaxConns = 16
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// redisClient is a client for the lock as docs/configuration.md sets one up:
// no client-side retries, one dial per attempt and a short dial timeout.
func redisClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: addr, MaxRetries: -1, DialerRetries: 1, DialTimeout: 250 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// ---- scenarios -----------------------------------------------------------

// markSlow makes every fourth intent a slow payment call, long enough to be
// in flight when Redis is lost, and has each of them sent twice at once.
func markSlow(i int, in *intent) {
	if i%4 == 0 {
		in.slow, in.twin = true, true
	}
}

// Redis is killed (SIGKILL, every lease lost) in the middle of the load and
// restarted 600ms later. Requests in flight fall back to the table claim;
// an intent whose lease holder was running when Redis died is refused by
// its durable row, never run again.
func TestFaultRedisKilled(t *testing.T) {
	heavy.Gate(t) // the fault suite: seconds of load per scenario
	srv := tempserver.StartRedis(t)
	pool, dbcfg := sharedPG(t)
	r := newRig(t, rigOpts{strategy: "hybrid", pool: pool, dbcfg: dbcfg,
		redis: redisClient(t, srv.Addr()), prefix: "idem:", leaseTTL: redisLeaseTTL, workTO: redisWorkTimeout})
	var killFrom, killTo time.Time
	all, recovered := r.load(8, 2*time.Second, markSlow, func() {
		time.Sleep(700 * time.Millisecond)
		killFrom = time.Now()
		require.NoError(t, srv.Kill())
		killTo = time.Now()
		time.Sleep(600 * time.Millisecond)
		require.NoError(t, srv.Start())
	})
	f := figures{scenario: "redis-killed", strategy: "hybrid", faults: 1, recovered: recovered}
	r.finish(t, &f, all, faultLeaseTTL+time.Second)
	require.NotZero(t, f.fallbacks, "requests during the outage fall back to the table claim")
	inFlight := 0
	for _, in := range all {
		if overlapped(in, killFrom, killTo, 5*time.Millisecond) {
			inFlight++
		}
	}
	require.NotZero(t, inFlight, "some work was running when Redis died")
	r.fresh(t)
	f.log(t)
}

// Redis answers slowly (300ms each way, beyond the lock's 500ms timeout),
// then has its connections reset four times, then stalls.
func TestFaultRedisSlowAndReset(t *testing.T) {
	heavy.Gate(t) // the fault suite: seconds of load per scenario
	srv := tempserver.StartRedis(t)
	proxy := faultproxy.Start(t, srv.Addr())
	pool, dbcfg := sharedPG(t)
	r := newRig(t, rigOpts{strategy: "hybrid", pool: pool, dbcfg: dbcfg,
		redis: redisClient(t, proxy.Addr()), prefix: "idem:", leaseTTL: redisLeaseTTL, workTO: redisWorkTimeout})
	var from, to time.Time
	faults := 0
	all, recovered := r.load(8, 2500*time.Millisecond, markSlow, func() {
		time.Sleep(500 * time.Millisecond)
		from = time.Now()
		proxy.SetLatency(300 * time.Millisecond)
		faults++
		time.Sleep(600 * time.Millisecond)
		proxy.SetLatency(0)
		for range 4 {
			proxy.CutAll()
			faults++
			time.Sleep(100 * time.Millisecond)
		}
		proxy.Stall()
		faults++
		time.Sleep(400 * time.Millisecond)
		require.NoError(t, proxy.Resume())
		to = time.Now()
	})
	f := figures{scenario: "redis-slow-reset", strategy: "hybrid", faults: faults, recovered: recovered}
	r.finish(t, &f, all, faultLeaseTTL+time.Second)
	require.NotZero(t, f.fallbacks)
	require.False(t, from.IsZero() || to.IsZero())
	r.fresh(t)
	f.log(t)
}

// PostgreSQL becomes unreachable (connections refused and open ones reset)
// mid-load and comes back; separately, the server crashes (pg_ctl stop -m
// immediate) and restarts. The guard fails closed (503) and never runs the
// work unguarded.
func TestFaultPostgresDown(t *testing.T) {
	heavy.Gate(t) // the fault suite: seconds of load per scenario
	pg := tempserver.StartPostgres(t)
	for _, tc := range []struct{ strategy, fault string }{
		{"table", "refused"}, {"hybrid", "refused"}, {"table", "crash"}, {"hybrid", "crash"},
	} {
		t.Run(fmt.Sprintf("strategy=%s/fault=%s", tc.strategy, tc.fault), func(t *testing.T) {
			proxy := faultproxy.Start(t, pg.Addr())
			pool := poolFor(t, pg.URLVia(proxy.Addr()), nil)
			admin := poolFor(t, pg.URL(), nil)
			dbcfg := &durable.Config{Schema: testdb.Schema(t, admin)}
			require.NoError(t, durable.Migrate(t.Context(), admin, dbcfg))
			o := rigOpts{strategy: tc.strategy, pool: pool, dbcfg: dbcfg}
			if tc.strategy == "hybrid" {
				c := testredis.Client(t)
				o.redis, o.prefix = c, testredis.Prefix(t, c)
			}
			r := newRig(t, o)
			// The outage lasts its time and, on a loaded machine where the
			// load may not reach PostgreSQL in that time, until a request
			// has met it (at most 5 s more), so that it is tested.
			outage := func(d time.Duration) {
				time.Sleep(d)
				for end := time.Now().Add(5 * time.Second); r.status503.Load() == 0 && time.Now().Before(end); {
					time.Sleep(10 * time.Millisecond)
				}
			}
			all, recovered := r.load(6, 2*time.Second, nil, func() {
				time.Sleep(600 * time.Millisecond)
				if tc.fault == "refused" {
					proxy.Refuse()
					outage(700 * time.Millisecond)
					require.NoError(t, proxy.Resume())
				} else {
					require.NoError(t, pg.Stop("immediate"))
					outage(300 * time.Millisecond)
					require.NoError(t, pg.Start())
				}
			})
			f := figures{scenario: "postgres-" + tc.fault, strategy: tc.strategy, faults: 1, recovered: recovered}
			r.finish(t, &f, all, faultLeaseTTL+time.Second)
			require.NotZero(t, f.status503, "requests during the outage are refused with 503")
			r.fresh(t)
			// An instance started during the outage, then the outage ends:
			// nothing it holds (no lease the store cannot back, no state of
			// its own) keeps fresh intents from running at once.
			restarted := newRig(t, o)
			restarted.fresh(t)
			f.log(t)
		})
	}
}

// A statement timeout hits the statement that stores the answer: a trigger
// sleeps 1s on answers that carry a marker, and the pool's connections have
// statement_timeout = 400ms. The caller still gets its answer; the key stays
// in progress until reconciled.
func TestFaultStatementTimeoutOnStore(t *testing.T) {
	heavy.Gate(t) // the fault suite: seconds of load per scenario
	for _, strategy := range []string{"table", "hybrid"} {
		t.Run("strategy="+strategy, func(t *testing.T) {
			pool, dbcfg := sharedPG(t)
			ds, err := durable.New(pool, dbcfg)
			require.NoError(t, err)
			table := ds.Table()
			trigger := pgx.Identifier{dbcfg.Schema, "slow_store"}.Sanitize()
			_, err = pool.Exec(t.Context(), `
CREATE FUNCTION `+trigger+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.response_status IS NOT NULL AND position('slow-store'::bytea IN NEW.response_body) > 0 THEN
		PERFORM pg_sleep(1);
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER slow_store BEFORE INSERT OR UPDATE ON `+table+` FOR EACH ROW EXECUTE FUNCTION `+trigger+`();`)
			require.NoError(t, err)
			limited := poolFor(t, testdb.URL(), map[string]string{"statement_timeout": "400"})
			o := rigOpts{strategy: strategy, pool: limited, dbcfg: dbcfg}
			if strategy == "hybrid" {
				c := testredis.Client(t)
				o.redis, o.prefix = c, testredis.Prefix(t, c)
			}
			r := newRig(t, o)
			var faultOn atomic.Bool
			faultOn.Store(true)
			all, recovered := r.load(6, 2*time.Second, func(i int, in *intent) {
				in.slowStore = faultOn.Load() && i%4 == 1
			}, func() {
				time.Sleep(time.Second)
				// The fault clears: the trigger goes.
				faultOn.Store(false)
				_, err := pool.Exec(context.Background(), "DROP TRIGGER slow_store ON "+table)
				require.NoError(t, err)
			})
			f := figures{scenario: "pg-statement-timeout", strategy: strategy, recovered: recovered}
			r.finish(t, &f, all, faultLeaseTTL+time.Second)
			for _, in := range all {
				if r.store.lost(in) {
					f.faults++
				}
			}
			require.NotZero(t, f.faults, "some stores must have timed out")
			// A store that timed out is retried (100 ms, 400 ms); what still
			// failed left its key in progress for the reconciler.
			require.LessOrEqual(t, f.settled+f.released, f.faults, "only keys whose store failed needed the reconciler")
			r.fresh(t)
			f.log(t)
		})
	}
}

// The lease expires while the work runs (miniredis FastForward past the TTL
// in the middle of the work), and a retry arrives then: it takes a new lease
// and claims, and the claim finds the running row: 409, never a second run.
// This is a lease lost before the work ends (Redis eviction, failover, clock
// jump, work longer than the TTL).
func TestFaultLeaseExpiresDuringWork(t *testing.T) {
	heavy.Gate(t) // the fault suite: seconds of load per scenario
	pool, dbcfg := sharedPG(t)
	mr := miniredis.RunT(t)
	c := testredis.Miniredis(t, mr)
	r := newRig(t, rigOpts{strategy: "hybrid", pool: pool, dbcfg: dbcfg, redis: c, prefix: "idem:", mr: mr})
	var (
		mu       sync.Mutex
		forwards []time.Time
	)
	r.onWork = func(ctx context.Context, in *intent, n int) {
		if n != 0 || !in.leaseExpiry {
			return
		}
		mu.Lock()
		forwards = append(forwards, time.Now())
		mr.FastForward(faultLeaseTTL + time.Second)
		mu.Unlock()
		// A retry arrives while the first execution still runs.
		r.drive(context.Background(), in, in.key[len(in.key)-1]%2 == 0, time.Now().Add(300*time.Millisecond))
	}
	all, _ := r.load(6, 1500*time.Millisecond, func(i int, in *intent) { in.leaseExpiry = i%10 == 5 }, nil)
	f := figures{scenario: "lease-expired-mid-work", strategy: "hybrid"}
	mu.Lock()
	f.faults = len(forwards)
	fw := append([]time.Time(nil), forwards...)
	mu.Unlock()
	r.finish(t, &f, all, time.Second)
	require.NotZero(t, f.faults)
	require.Len(t, fw, f.faults)
	r.fresh(t)
	f.log(t)
}

// In real time, work that outlives its lease (a 1.5s provider call under a
// 1s lease): retries after the lease is gone reach the durable claim, which
// still refuses them with 409 while the work runs; it runs once and its
// answer is stored and replayed.
func TestFaultWorkOutlivesLease(t *testing.T) {
	heavy.Gate(t) // the fault suite: seconds of load per scenario
	pool, dbcfg := sharedPG(t)
	c := testredis.Client(t)
	r := newRig(t, rigOpts{strategy: "hybrid", pool: pool, dbcfg: dbcfg, redis: c, prefix: testredis.Prefix(t, c),
		leaseTTL: time.Second, workTO: 3 * time.Second})
	const workTime = 1500 * time.Millisecond
	r.onWork = func(ctx context.Context, in *intent, n int) {
		select { // a provider call that takes longer than the lease
		case <-ctx.Done():
		case <-time.After(workTime):
		}
	}
	ctx := context.Background()
	const n = 8
	ins := make([]*intent, n)
	firsts := make([]view, n)
	var wg sync.WaitGroup
	for i := range n {
		ins[i] = r.newIntent(i)
		r.register(ins[i])
		wg.Go(func() { firsts[i] = r.send(ctx, ins[i], i%2 == 0) })
	}
	time.Sleep(1200 * time.Millisecond) // every lease has expired; the work still runs
	for i, in := range ins {
		v := r.send(ctx, in, i%2 == 1)
		require.Equal(t, http.StatusConflict, v.status, "the durable row refuses the retry")
	}
	wg.Wait()
	for i, in := range ins {
		require.True(t, firsts[i].final(), "the first request got its answer: %d", firsts[i].status)
		require.Len(t, in.execs, 1)
		require.True(t, in.execs[0].charged)
		require.Equal(t, firsts[i], r.send(ctx, in, i%2 == 0), "replayed")
	}
	require.Zero(t, r.served500.Load())
	require.Zero(t, r.stats().DoubleExecutions)
}

// The process dies between the work and the store: the store of the answer
// fails (its context is cancelled). In both strategies the claimed row stays
// in progress, retries get 409 until a reconciler settles the key; the work
// never runs twice.
func TestFaultCrashBetweenWorkAndStore(t *testing.T) {
	heavy.Gate(t) // the fault suite: seconds of load per scenario
	for _, strategy := range []string{"table", "hybrid"} {
		t.Run("strategy="+strategy, func(t *testing.T) {
			pool, dbcfg := sharedPG(t)
			o := rigOpts{strategy: strategy, pool: pool, dbcfg: dbcfg}
			var crashing sync.Map
			o.crash = func(scope, key string) bool {
				_, ok := crashing.Load(scope + "\x00" + key)
				return ok
			}
			if strategy == "hybrid" {
				o.mr = miniredis.RunT(t)
				o.redis, o.prefix = testredis.Miniredis(t, o.mr), "idem:"
			}
			r := newRig(t, o)
			var faultOn atomic.Bool
			faultOn.Store(true)
			all, recovered := r.load(6, 2*time.Second, func(i int, in *intent) {
				if faultOn.Load() && i%5 == 2 {
					in.crash = true
					crashing.Store(in.scope+"\x00"+in.key, true)
				}
			}, func() {
				time.Sleep(time.Second)
				faultOn.Store(false) // the replacement process stores normally
				crashing.Clear()
			})
			// The crashed processes are gone: their leases expire.
			if r.mr != nil {
				r.mr.FastForward(faultLeaseTTL + time.Second)
			}
			f := figures{scenario: "crash-before-store", strategy: strategy, faults: int(r.store.crashes.Load()), recovered: recovered}
			r.finish(t, &f, all, 500*time.Millisecond)
			require.NotZero(t, f.faults)
			require.LessOrEqual(t, f.settled, f.faults, "only crashed keys waited for the reconciler")
			require.NotZero(t, f.settled, "crashed keys waited for the reconciler")
			r.fresh(t)
			f.log(t)
		})
	}
}

// Hybrid: the answer cannot be stored after the work ran (the PostgreSQL
// write fails, the process is about to die). The claimed row stays in
// progress, so retries get 409 during the lease and after it, until a
// reconciler settles the key; the work never runs again.
func TestFaultHybridLostStoreStaysInProgress(t *testing.T) {
	heavy.Gate(t) // the fault suite: seconds of load per scenario
	pool, dbcfg := sharedPG(t)
	mr := miniredis.RunT(t)
	var failing atomic.Bool
	failing.Store(true)
	r := newRig(t, rigOpts{strategy: "hybrid", pool: pool, dbcfg: dbcfg, redis: testredis.Miniredis(t, mr), prefix: "idem:", mr: mr,
		crash: func(string, string) bool { return failing.Load() }})
	ctx := context.Background()
	in := r.newIntent(1)
	r.register(in)

	first := r.send(ctx, in, false)
	require.Equal(t, http.StatusCreated, first.status, "the caller gets its answer")
	require.Equal(t, http.StatusConflict, r.send(ctx, in, true).status, "in progress while the lease lives")

	failing.Store(false) // PostgreSQL is fine again
	mr.FastForward(faultLeaseTTL + time.Second)
	require.Equal(t, http.StatusConflict, r.send(ctx, in, true).status, "in progress after the lease, too")
	require.Len(t, in.charged(), 1, "the work must not run a second time")

	require.NoError(t, r.guard.Settle(ctx, in.scope, in.key, ownerOf(t, r.store, in.scope, in.key), in.charged()[0].answer))
	require.Equal(t, first, r.send(ctx, in, false), "settled to the answer the client was told")
}

// A fleet in the middle of a rolling deploy: one instance on the hybrid
// strategy, one on the table strategy, over one table. Requests and their
// concurrent retries alternate between the two while slow payment calls are
// in flight: a retry that reaches the table instance while the hybrid runs
// the work loses the claim and gets 409, and the other way round.
func TestFaultMixedFleet(t *testing.T) {
	heavy.Gate(t) // the fault suite: seconds of load per scenario
	pool, dbcfg := sharedPG(t)
	c := testredis.Client(t)
	r := newRig(t, rigOpts{strategy: "mixed", pool: pool, dbcfg: dbcfg, redis: c, prefix: testredis.Prefix(t, c),
		leaseTTL: redisLeaseTTL, workTO: redisWorkTimeout, peerTable: true})
	require.Equal(t, "hybrid", r.insts[0].guard.Strategy())
	require.Equal(t, "table", r.insts[1].guard.Strategy())
	all, _ := r.load(8, 2*time.Second, markSlow, nil)
	f := figures{scenario: "mixed-fleet", strategy: "mixed"}
	r.finish(t, &f, all, faultLeaseTTL+time.Second)
	require.NotZero(t, f.status409, "retries reached one instance while the other ran the work")
	r.fresh(t)
	f.log(t)
}

// A partial partition: two hybrid instances, Redis reachable from the first
// and refused to the second for 1.2s in the middle of the load. The second
// falls back to the table claim for the intents the first holds leases of,
// and its claims lose to their rows.
func TestFaultPartialPartition(t *testing.T) {
	heavy.Gate(t) // the fault suite: seconds of load per scenario
	pool, dbcfg := sharedPG(t)
	c := testredis.Client(t)
	proxy := faultproxy.Start(t, testredis.Addr())
	r := newRig(t, rigOpts{strategy: "hybrid", pool: pool, dbcfg: dbcfg, redis: c, prefix: testredis.Prefix(t, c),
		leaseTTL: redisLeaseTTL, workTO: redisWorkTimeout, peers: []redis.UniversalClient{redisClient(t, proxy.Addr())}})
	all, recovered := r.load(8, 2500*time.Millisecond, markSlow, func() {
		time.Sleep(500 * time.Millisecond)
		proxy.Refuse()
		proxy.CutAll()
		time.Sleep(1200 * time.Millisecond)
		require.NoError(t, proxy.Resume())
	})
	f := figures{scenario: "partial-partition", strategy: "hybrid", faults: 1, recovered: recovered}
	r.finish(t, &f, all, faultLeaseTTL+time.Second)
	require.NotZero(t, f.fallbacks, "the cut-off instance fell back to the table claim")
	r.fresh(t)
	f.log(t)
}

// Redis busy: a lock client of one connection whose every exchange takes
// longer than the lock's 500ms timeout (300ms each way), then a 700ms stall
// of every connection. The lease call times out, the request falls back to
// the table claim while the lease holder may still run the work, and the
// claim refuses it. (A one-connection pool does not run out by itself: the
// Locker's commands share one exchange at a time, in one pipeline.)
func TestFaultRedisBusy(t *testing.T) {
	heavy.Gate(t) // the fault suite: seconds of load per scenario
	for _, fault := range []string{"slower-than-timeout", "stall-700ms"} {
		t.Run("fault="+fault, func(t *testing.T) {
			pool, dbcfg := sharedPG(t)
			proxy := faultproxy.Start(t, testredis.Addr())
			opts := &redis.Options{Addr: proxy.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1,
				DialerRetries: 1, DialTimeout: 250 * time.Millisecond}
			if fault == "slower-than-timeout" {
				opts.PoolSize = 1
			}
			c := redis.NewClient(opts)
			t.Cleanup(func() { _ = c.Close() })
			r := newRig(t, rigOpts{strategy: "hybrid", pool: pool, dbcfg: dbcfg, redis: c, prefix: testredis.Prefix(t, testredis.Client(t)),
				leaseTTL: redisLeaseTTL, workTO: redisWorkTimeout})
			all, recovered := r.load(8, 2500*time.Millisecond, markSlow, func() {
				time.Sleep(500 * time.Millisecond)
				if fault == "slower-than-timeout" {
					proxy.SetLatency(300 * time.Millisecond)
					time.Sleep(1200 * time.Millisecond)
					proxy.SetLatency(0)
					return
				}
				proxy.Stall()
				time.Sleep(700 * time.Millisecond)
				require.NoError(t, proxy.Resume())
			})
			f := figures{scenario: "redis-" + fault, strategy: "hybrid", faults: 1, recovered: recovered}
			r.finish(t, &f, all, faultLeaseTTL+time.Second)
			require.NotZero(t, f.fallbacks, "the lease call timed out and fell back to the table claim")
			r.fresh(t)
			f.log(t)
		})
	}
}
