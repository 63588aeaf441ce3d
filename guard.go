// Package idem makes retried requests safe: it runs the work of a request at
// most once per (scope, idempotency key) and replays the stored answer to
// every retry.
//
// A [Guard] decides, for each request, one of: run the work and store its
// answer; replay an earlier answer; refuse with [ErrInProgress] (409) because
// an execution is running or its answer is unknown; or refuse with
// [ErrKeyReused] (422) because the key was first used for a different request.
// [Guard.Do] is the transport-agnostic core; [Guard.Middleware] wraps an
// http.Handler with it.
//
// Answers live in PostgreSQL (package durable). Two strategies decide who
// runs:
//
//   - table (no lock configured): INSERT ... ON CONFLICT DO NOTHING on the
//     idempotency table decides the race. Two PostgreSQL writes per first
//     execution, one read-only round trip per replay.
//   - hybrid ([Config.Lock] set): SET NX EX in Redis (package lock) decides
//     "in progress" at Redis speed; PostgreSQL is read under the lock and
//     written once, after the work. An expired lock cannot cause a second
//     execution of a finished request, because the answer is read from
//     PostgreSQL under every lock.
//
// The README compares both strategies' guarantees (crash, Redis loss, lock
// expiry, 5xx) in detail.
package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/metric"

	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/lock"
)

// Request names one intent: who asks (Scope), under which idempotency key,
// and what they sent (Fingerprint).
type Request struct {
	// Scope is the authenticated caller, e.g. the user id. Keys are unique per
	// scope: another scope's key is a key nobody has seen. Required: 1 to
	// 1024 bytes of valid UTF-8 without NUL.
	Scope string
	// Key is the client's idempotency key. Required: 1 to 255 bytes of valid
	// UTF-8 without NUL (the middleware further restricts it to printable
	// ASCII).
	Key string
	// Fingerprint identifies the request's content (see HashRequest). A retry
	// must send the same one. The zero Fingerprint is refused.
	Fingerprint Fingerprint
}

// Limits on Request fields.
const (
	MaxKeyLen   = 255
	MaxScopeLen = 1024
)

func (r Request) validate() error {
	if err := validText(r.Scope, MaxScopeLen); err != "" {
		return &RequestError{Field: "Scope", Reason: err}
	}
	if err := validText(r.Key, MaxKeyLen); err != "" {
		return &RequestError{Field: "Key", Reason: err}
	}
	if r.Fingerprint == (Fingerprint{}) {
		return &RequestError{Field: "Fingerprint", Reason: "zero"}
	}
	return nil
}

func validText(s string, max int) string {
	switch {
	case s == "":
		return "empty"
	case len(s) > max:
		return fmt.Sprintf("longer than %d bytes", max)
	case !utf8.ValidString(s):
		return "not valid UTF-8"
	}
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return "contains NUL"
		}
	}
	return ""
}

// Response is a finished answer: what is stored and replayed. Header holds
// only what the caller chose to keep (the middleware keeps an allowlist).
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Work is the guarded operation. Its ctx carries the execution (see
// [MarkRetrySafe]) and, in hybrid mode, a deadline that ends before the lock's
// TTL. The returned Response decides what happens to the key:
//
//   - status 100-499 except 429: stored and replayed to every retry;
//   - 429, an error wrapping ErrRetrySafe, or MarkRetrySafe called: the key is
//     released, the next retry runs the work again;
//   - 5xx or any other error: not stored, the key stays in progress until it
//     is settled or released, or expires.
type Work func(ctx context.Context) (Response, error)

// Store is what the Guard needs from the durable store. *durable.Store
// implements it; see that package for each call's promise.
type Store interface {
	Claim(ctx context.Context, p durable.ClaimParams) (durable.Record, bool, error)
	Get(ctx context.Context, scope, key string) (durable.Record, error)
	Insert(ctx context.Context, p durable.ClaimParams, a *durable.Answer) (durable.Record, error)
	Complete(ctx context.Context, scope, key string, owner durable.Token, a durable.Answer) error
	Release(ctx context.Context, scope, key string, owner durable.Token) error
	Settle(ctx context.Context, scope, key string, a durable.Answer) error
	ReleaseInProgress(ctx context.Context, scope, key string) error
}

// Config tunes a Guard. A nil *Config is valid: the table strategy with every
// default.
type Config struct {
	// Lock, when set, selects the hybrid strategy: a Redis lease decides who
	// runs, PostgreSQL stores the answer. Defaults to nil (table strategy).
	Lock *lock.Locker
	// WorkTimeout bounds the work's context. In hybrid mode it is measured
	// from just before the lease is requested and WorkTimeout + StoreTimeout
	// must be shorter than the lease TTL, so that the answer is stored while
	// the lease is still held. Defaults to 0 (no bound) in table mode and to
	// the lease TTL - StoreTimeout - 1s in hybrid mode (24s with the
	// defaults).
	WorkTimeout time.Duration
	// DetachWork runs the work with a context that the caller's cancellation
	// (a client hanging up) does not reach; it keeps the caller's values and
	// the WorkTimeout deadline. A charge in flight then finishes and its
	// answer is stored, instead of ending as an unknown outcome that needs
	// reconciliation. Defaults to false.
	//
	// WARNING: in table mode with no WorkTimeout, detached work is bounded
	// only by itself.
	DetachWork bool
	// StoreRetryFor is how long, in hybrid mode, the guard keeps trying in
	// the background to write an answer (or an in-progress row) whose write
	// failed after the work ran, while the lease, extended to the retention,
	// keeps retries at 409. Once written, the lease is released and retries
	// are replayed (or, for an in-progress row, the reconciler can settle
	// the key). Retries back off from 1s to 30s. Call Guard.Close to stop
	// them. Defaults to 10m; negative disables.
	StoreRetryFor time.Duration
	// StoreTimeout bounds each call to the store and, after the work, the
	// call that stores its answer (which runs even if the caller's context is
	// cancelled, so a client that hangs up does not lose the answer).
	// Defaults to 5s.
	StoreTimeout time.Duration
	// Logger receives one line per decision worth a human's attention
	// (fallback to the table claim, store failure, lost lease). Keys are
	// logged as a short hash (see KeyHash), never in clear. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// MeterProvider, when set, receives the guard's metrics through the
	// OpenTelemetry metric API: the counter "idem.events" by event
	// (executed, replayed, in_progress, key_reused, key_missing, key_invalid,
	// fallback, released, settled, store_error, lock_lost, double_execution,
	// cache_hit) and the histogram "idem.phase.duration" of the guard's own
	// steps (lock, claim, read, store, release). Defaults to nil: no metrics
	// and no cost beyond the atomic counters behind Stats.
	MeterProvider metric.MeterProvider
	// CacheSize, when positive, keeps up to that many finished answers in an
	// in-process LRU, so that a retry storm on a hot key is replayed (or
	// refused with ErrKeyReused) without any round trip. In-progress state is
	// never cached, and an entry never outlives its key's retention in the
	// store. Defaults to 0: no cache.
	//
	// WARNING: an answer deleted from the store by hand is still replayed by
	// every instance that cached it, for up to CacheTTL.
	CacheSize int
	// CacheTTL bounds how long an answer stays in the cache. Defaults to 1m.
	CacheTTL time.Duration
}

const (
	defaultStoreTimeout  = 5 * time.Second
	defaultStoreRetryFor = 10 * time.Minute
	defaultCacheTTL      = time.Minute
	// cacheSkew is subtracted from a key's expiry in the store when caching
	// its answer, to absorb skew between the database and local clocks.
	cacheSkew = time.Minute
)

// Strategy names how a Guard decides who runs.
type Strategy string

const (
	StrategyTable  Strategy = "table"
	StrategyHybrid Strategy = "hybrid"
)

// Guard runs work at most once per (scope, key). It is safe for concurrent use
// by any number of goroutines and holds no per-request state.
type Guard struct {
	store        Store
	lock         *lock.Locker
	workTimeout  time.Duration
	detach       bool
	storeTimeout time.Duration
	log          *slog.Logger
	retention    time.Duration // the store's, when it tells; bounds cache entries
	cache        *answerCache  // nil without Config.CacheSize
	tel          telemetry

	// Background writes of answers whose write failed (hybrid): see
	// Config.StoreRetryFor and Close.
	storeRetryFor time.Duration
	bgMu          sync.Mutex
	bgClosed      bool
	bgStop        chan struct{}
	bg            sync.WaitGroup
}

// retentionReporter is implemented by stores that tell how long keys live
// (*durable.Store does).
type retentionReporter interface{ Retention() time.Duration }

// New returns a Guard over store. A nil cfg gives the table strategy with every
// default. Invalid fields are reported by name.
func New(store Store, cfg *Config) (*Guard, error) {
	if store == nil {
		return nil, errors.New("idem: nil store")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = defaultStoreTimeout
	}
	if c.StoreTimeout < 0 {
		return nil, fmt.Errorf("idem: Config.StoreTimeout %v must be positive", c.StoreTimeout)
	}
	if c.WorkTimeout < 0 {
		return nil, fmt.Errorf("idem: Config.WorkTimeout %v must not be negative", c.WorkTimeout)
	}
	if c.Lock != nil {
		ttl := c.Lock.TTL()
		if c.WorkTimeout == 0 {
			c.WorkTimeout = ttl - c.StoreTimeout - time.Second
		}
		if c.WorkTimeout <= 0 || c.WorkTimeout+c.StoreTimeout >= ttl {
			return nil, fmt.Errorf("idem: Config.WorkTimeout %v + Config.StoreTimeout %v must be positive and shorter than the lock TTL %v",
				c.WorkTimeout, c.StoreTimeout, ttl)
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.CacheSize < 0 {
		return nil, fmt.Errorf("idem: Config.CacheSize %d must not be negative", c.CacheSize)
	}
	if c.CacheTTL < 0 {
		return nil, fmt.Errorf("idem: Config.CacheTTL %v must not be negative", c.CacheTTL)
	}
	if c.CacheTTL == 0 {
		c.CacheTTL = defaultCacheTTL
	}
	if c.StoreRetryFor == 0 {
		c.StoreRetryFor = defaultStoreRetryFor
	}
	g := &Guard{
		storeRetryFor: c.StoreRetryFor,
		bgStop:        make(chan struct{}),
		store:         store,
		lock:          c.Lock,
		workTimeout:   c.WorkTimeout,
		detach:        c.DetachWork,
		storeTimeout:  c.StoreTimeout,
		log:           c.Logger,
	}
	if r, ok := store.(retentionReporter); ok {
		g.retention = r.Retention()
	}
	if c.CacheSize > 0 {
		g.cache = newAnswerCache(c.CacheSize, c.CacheTTL)
	}
	if err := g.tel.init(c.MeterProvider); err != nil {
		return nil, fmt.Errorf("idem: Config.MeterProvider: %w", err)
	}
	return g, nil
}

// Strategy reports the guard's strategy.
func (g *Guard) Strategy() Strategy {
	if g.lock != nil {
		return StrategyHybrid
	}
	return StrategyTable
}

// Do runs work at most once for req's (Scope, Key) and returns its answer, or
// the stored answer of an earlier execution with the same fingerprint.
//
// The returned error is nil whenever there is an answer to deliver (executed
// or replayed; for OutcomeExecutedPending it is the work's own error, if any).
// Otherwise the work did not run and the error wraps one of ErrInProgress,
// ErrKeyReused, ErrUnavailable, ErrInvalidRequest, or is the context's error.
//
// If work panics, the key is released and the panic continues.
func (g *Guard) Do(ctx context.Context, req Request, work Work) (Response, Outcome, error) {
	if err := req.validate(); err != nil {
		return Response{}, OutcomeNone, err
	}
	if work == nil {
		return Response{}, OutcomeNone, errors.New("idem: nil work")
	}
	if g.cache != nil {
		if e, ok := g.cache.get(req); ok {
			if e.fp != req.Fingerprint {
				g.tel.add(ctx, evKeyReused)
				return Response{}, OutcomeKeyReused, ErrKeyReused
			}
			g.tel.add(ctx, evCacheHit)
			g.tel.add(ctx, evReplayed)
			return cloneResponse(e.resp), OutcomeReplayed, nil
		}
	}
	if g.lock != nil {
		return g.doHybrid(ctx, req, work)
	}
	return g.doTable(ctx, req, work)
}

// doTable: the unique constraint decides. Claim, run, store.
func (g *Guard) doTable(ctx context.Context, req Request, work Work) (Response, Outcome, error) {
	owner := newToken()
	sctx, cancel := context.WithTimeout(ctx, g.storeTimeout)
	t0 := g.tel.start()
	rec, claimed, err := g.store.Claim(sctx, durable.ClaimParams{
		Scope: req.Scope, Key: req.Key, Fingerprint: req.Fingerprint, Owner: owner,
	})
	g.tel.since(ctx, phaseClaim, t0)
	cancel()
	if err != nil {
		return g.storeFailed(ctx, req, "claim", err)
	}
	if !claimed {
		return g.decide(ctx, req, rec)
	}
	x := &execution{g: g, req: req, owner: owner, mode: StrategyTable, createdAt: rec.CreatedAt}
	return x.run(ctx, g.workContext, work)
}

// doHybrid: a Redis lease decides who runs; PostgreSQL is read under it and
// written once after the work.
func (g *Guard) doHybrid(ctx context.Context, req Request, work Work) (Response, Outcome, error) {
	start := time.Now()
	lease, err := g.lock.Obtain(ctx, req.Scope, req.Key)
	g.tel.since(ctx, phaseLock, start)
	switch {
	case errors.Is(err, lock.ErrNotObtained):
		// Somebody runs it now, or ran it and still holds the lease: the
		// durable row tells which.
		return g.readDecide(ctx, req)
	case errors.Is(err, lock.ErrUnavailable):
		g.tel.add(ctx, evFallback)
		g.log.LogAttrs(ctx, slog.LevelWarn, "idem: redis unavailable, falling back to the table claim",
			slog.String("key_hash", keyHash(req)), slog.Any("error", err))
		return g.doTable(ctx, req, work)
	case err != nil:
		return Response{}, OutcomeNone, err // the caller's context ended
	}

	// The lease is ours. Give it back when done, unless the work ran and its
	// outcome could not be recorded: then the lease is all that stops a retry
	// from running the work again, so it is kept, extended to the retention,
	// until the row is written in the background (holdLease, storeLater).
	x := &execution{g: g, req: req, owner: newToken(), mode: StrategyHybrid, lease: lease}
	defer func() {
		if x.keepLease {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.storeTimeout)
		defer cancel()
		t0 := g.tel.start()
		err := lease.Release(rctx)
		g.tel.since(ctx, phaseRelease, t0)
		if err != nil {
			if errors.Is(err, lock.ErrNotHeld) {
				g.tel.add(ctx, evLockLost)
				g.log.LogAttrs(ctx, slog.LevelError, "idem: lease expired before it was released",
					slog.String("key_hash", keyHash(req)))
				return
			}
			g.log.LogAttrs(ctx, slog.LevelWarn, "idem: releasing lease failed; it expires by its TTL",
				slog.String("key_hash", keyHash(req)), slog.Any("error", err))
		}
	}()

	resp, out, err, found := g.readExisting(ctx, req)
	if found || err != nil {
		return resp, out, err
	}
	deadline := start.Add(g.workTimeout)
	return x.run(ctx, func(ctx context.Context) (context.Context, context.CancelFunc) {
		return context.WithDeadline(ctx, deadline)
	}, work)
}

// readDecide answers a request that lost the lease from the durable row.
func (g *Guard) readDecide(ctx context.Context, req Request) (Response, Outcome, error) {
	resp, out, err, found := g.readExisting(ctx, req)
	if found || err != nil {
		return resp, out, err
	}
	// Lease held, no row: the holder is running the work right now.
	g.tel.add(ctx, evInProgress)
	return Response{}, OutcomeInProgress, ErrInProgress
}

// readExisting reads the durable row: found reports whether one decided the
// request.
func (g *Guard) readExisting(ctx context.Context, req Request) (Response, Outcome, error, bool) {
	sctx, cancel := context.WithTimeout(ctx, g.storeTimeout)
	t0 := g.tel.start()
	rec, err := g.store.Get(sctx, req.Scope, req.Key)
	g.tel.since(ctx, phaseRead, t0)
	cancel()
	switch {
	case errors.Is(err, durable.ErrNotFound):
		return Response{}, OutcomeNone, nil, false
	case err != nil:
		resp, out, err := g.storeFailed(ctx, req, "read", err)
		return resp, out, err, true
	}
	resp, out, err := g.decide(ctx, req, rec)
	return resp, out, err, true
}

// decide answers a request whose key already has a row: a different
// fingerprint first (422, whatever the row's state), then no answer yet (409),
// else replay.
func (g *Guard) decide(ctx context.Context, req Request, rec durable.Record) (Response, Outcome, error) {
	switch {
	case rec.Fingerprint != req.Fingerprint:
		g.tel.add(ctx, evKeyReused)
		return Response{}, OutcomeKeyReused, ErrKeyReused
	case rec.Answer == nil:
		g.tel.add(ctx, evInProgress)
		return Response{}, OutcomeInProgress, ErrInProgress
	}
	g.tel.add(ctx, evReplayed)
	resp := Response(*rec.Answer)
	g.remember(req, resp, rec.CreatedAt)
	return resp, OutcomeReplayed, nil
}

// remember caches a finished answer of a key created at createdAt (database
// clock), so that it leaves the cache before the key expires in the store.
func (g *Guard) remember(req Request, resp Response, createdAt time.Time) {
	if g.cache == nil {
		return
	}
	var by time.Time
	if g.retention > 0 {
		if createdAt.IsZero() {
			createdAt = time.Now()
		}
		by = createdAt.Add(g.retention - cacheSkew)
	}
	g.cache.put(req, cloneResponse(resp), by)
}

func (g *Guard) storeFailed(ctx context.Context, req Request, op string, err error) (Response, Outcome, error) {
	if cerr := ctx.Err(); cerr != nil {
		return Response{}, OutcomeNone, fmt.Errorf("idem: %s: %w", op, errors.Join(cerr, err))
	}
	if errors.Is(err, durable.ErrInvalid) {
		// Do validates every field first, so this is a store with stricter
		// rules than the guard's.
		return Response{}, OutcomeNone, &RequestError{Field: "Request", Reason: "refused by the store: " + err.Error()}
	}
	g.tel.add(ctx, evStoreError)
	g.log.LogAttrs(ctx, slog.LevelError, "idem: store unavailable, failing closed",
		slog.String("op", op), slog.String("key_hash", keyHash(req)), slog.Any("error", err))
	return Response{}, OutcomeNone, fmt.Errorf("idem: %s: %w", op, errors.Join(ErrUnavailable, err))
}

func (g *Guard) workContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if g.workTimeout > 0 {
		return context.WithTimeout(ctx, g.workTimeout)
	}
	return ctx, func() {}
}

// storeContext is the context of a store call made on behalf of a request
// that may already have been cancelled: the answer must still be written.
func (g *Guard) storeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), g.storeTimeout)
}

// Settle stores the final answer of a key left in progress (by a 5xx, an
// error or a crash), so that the next retry is replayed resp. Use it once the
// real outcome is known. It returns durable.ErrNotFound when no live row
// exists and durable.ErrCompleted when the key already has an answer.
// Reconcilers use SettleOwned.
func (g *Guard) Settle(ctx context.Context, scope, key string, resp Response) error {
	return g.settle(ctx, scope, key, nil, resp)
}

// SettleOwned is Settle restricted to the claim of owner, the row's owner
// token as the reconciler listed it: if the key has been released and claimed
// again by a new request meanwhile, it returns durable.ErrNotOwner and
// changes nothing.
func (g *Guard) SettleOwned(ctx context.Context, scope, key string, owner durable.Token, resp Response) error {
	return g.settle(ctx, scope, key, &owner, resp)
}

func (g *Guard) settle(ctx context.Context, scope, key string, owner *durable.Token, resp Response) error {
	if disposition(resp, nil) != dispStore {
		return fmt.Errorf("idem: settle: status %d cannot be stored (5xx and 429 never are)", resp.Status)
	}
	var err error
	if owner != nil {
		err = g.store.Complete(ctx, scope, key, *owner, durable.Answer(resp))
	} else {
		err = g.store.Settle(ctx, scope, key, durable.Answer(resp))
	}
	if err != nil {
		return fmt.Errorf("idem: settle: %w", err)
	}
	g.tel.add(ctx, evSettled)
	g.log.LogAttrs(ctx, slog.LevelInfo, "idem: key settled",
		slog.String("key_hash", KeyHash(scope, key)), slog.Int("status", resp.Status))
	return nil
}

// Release deletes a key left in progress, declaring that nothing happened:
// the next retry runs the work. It returns durable.ErrNotFound when no live
// row exists and durable.ErrCompleted when the key already has an answer
// (which is never released). Reconcilers use ReleaseOwned.
func (g *Guard) Release(ctx context.Context, scope, key string) error {
	return g.release(ctx, scope, key, nil)
}

// ReleaseOwned is Release restricted to the claim of owner: a key claimed
// again by a new request meanwhile is not released (durable.ErrNotOwner).
func (g *Guard) ReleaseOwned(ctx context.Context, scope, key string, owner durable.Token) error {
	return g.release(ctx, scope, key, &owner)
}

func (g *Guard) release(ctx context.Context, scope, key string, owner *durable.Token) error {
	var err error
	if owner != nil {
		err = g.store.Release(ctx, scope, key, *owner)
	} else {
		err = g.store.ReleaseInProgress(ctx, scope, key)
	}
	if err != nil {
		return fmt.Errorf("idem: release: %w", err)
	}
	g.tel.add(ctx, evReleased)
	g.log.LogAttrs(ctx, slog.LevelInfo, "idem: key released",
		slog.String("key_hash", KeyHash(scope, key)))
	return nil
}

// MaxHold is the longest a request may keep its key in progress while it
// runs: WorkTimeout plus StoreTimeout. It is 0 when there is no bound (table
// strategy without a WorkTimeout). A reconciler must leave keys younger than
// this alone.
func (g *Guard) MaxHold() time.Duration {
	if g.workTimeout <= 0 {
		return 0
	}
	return g.workTimeout + g.storeTimeout
}

// MarkRetrySafe declares, from inside the work (ctx is the work's context or
// one derived from it), that the work did nothing a retry could repeat, for
// example a 503 from an open circuit breaker before any charge. Whatever
// status the work then returns, the key is released instead of stored or left
// in progress, and the next retry runs. It reports false, and does nothing,
// when ctx does not belong to a guarded execution.
func MarkRetrySafe(ctx context.Context) bool {
	x := executionFrom(ctx)
	if x == nil {
		return false
	}
	x.retrySafe.Store(true)
	return true
}

// RequestFromContext returns the Request of the guarded execution that ctx
// belongs to (the work's context, or the request context a guarded HTTP
// handler receives). Handlers use it to derive stable identifiers with
// DeriveID.
func RequestFromContext(ctx context.Context) (Request, bool) {
	x := executionFrom(ctx)
	if x == nil {
		return Request{}, false
	}
	return x.req, true
}

type executionKey struct{}

func executionFrom(ctx context.Context) *execution {
	x, _ := ctx.Value(executionKey{}).(*execution)
	return x
}

// execution is one run of the work under a claim (table) or a lease (hybrid).
type execution struct {
	g         *Guard
	req       Request
	owner     durable.Token
	mode      Strategy    // how the key was claimed: table (incl. hybrid fallback) or hybrid
	createdAt time.Time   // table: the claimed row's created_at
	retrySafe atomic.Bool // MarkRetrySafe was called
	joined    atomic.Bool // Complete wrote the answer through the caller's transaction
	stored    []string    // middleware: the header allowlist, applied by Complete
	keepLease bool        // hybrid: the durable row could not be written
	lease     *lock.Lease // hybrid: the lease this execution runs under
	extended  bool        // hybrid: the lease was extended to the retention

	// parent is the context the work's context derives from: an execution
	// is itself the context.Context that carries it (like the standard
	// library's value contexts), which saves an allocation per request. It
	// is set by run and lives only as long as the work.
	parent context.Context
}

func (x *execution) Deadline() (time.Time, bool) { return x.parent.Deadline() }
func (x *execution) Done() <-chan struct{}       { return x.parent.Done() }
func (x *execution) Err() error                  { return x.parent.Err() }
func (x *execution) Value(k any) any {
	if _, ok := k.(executionKey); ok {
		return x
	}
	return x.parent.Value(k)
}

type disp int

const (
	dispStore   disp = iota // a final answer: store it
	dispPending             // unknown: leave the key in progress
	dispRelease             // nothing happened: release the key
)

func disposition(resp Response, err error) disp {
	switch {
	case errors.Is(err, ErrRetrySafe):
		return dispRelease
	case err != nil:
		return dispPending
	case resp.Status == http.StatusTooManyRequests:
		return dispRelease
	case resp.Status < 100 || resp.Status >= 600:
		return dispPending
	case resp.Status >= 500:
		return dispPending
	}
	return dispStore
}

func (x *execution) run(ctx context.Context, bound func(context.Context) (context.Context, context.CancelFunc), work Work) (resp Response, out Outcome, err error) {
	base := ctx
	if x.g.detach {
		base = context.WithoutCancel(ctx)
	}
	x.parent = base
	wctx, cancel := bound(x)
	defer cancel()
	panicked := true
	defer func() {
		if panicked {
			x.abandon(ctx)
		}
	}()
	resp, err = work(wctx)
	panicked = false

	if x.joined.Load() {
		if out, ok := x.joinedOutcome(ctx, resp); ok {
			return resp, out, err
		}
		// The caller's transaction did not commit: decide as usual.
	}
	d := disposition(resp, err)
	if x.retrySafe.Load() {
		d = dispRelease
	}
	switch d {
	case dispRelease:
		x.abandon(ctx)
		x.g.tel.add(ctx, evReleased)
		return resp, OutcomeExecutedReleased, err
	case dispPending:
		x.g.tel.add(ctx, evPending)
		if x.mode == StrategyHybrid {
			// Leave a durable in-progress row, so retries get 409 after the
			// lease is gone, until reconciliation settles the key.
			x.insert(ctx, nil)
		}
		if err == nil && (resp.Status < 100 || resp.Status >= 600) {
			err = fmt.Errorf("idem: work returned invalid status %d", resp.Status)
		}
		return resp, OutcomeExecutedPending, err
	}
	a := durable.Answer(resp)
	createdAt := x.createdAt
	if x.mode == StrategyHybrid {
		ac := a
		rec, ok := x.insert(ctx, &ac)
		if !ok {
			return resp, OutcomeExecutedPending, nil
		}
		createdAt = rec.CreatedAt
	} else {
		cerr := x.retry(ctx, func(sctx context.Context) error {
			return x.g.store.Complete(sctx, x.req.Scope, x.req.Key, x.owner, a)
		})
		if cerr != nil {
			x.storeFailed(ctx, "complete", cerr)
			return resp, OutcomeExecutedPending, nil
		}
	}
	x.g.tel.add(ctx, evExecuted)
	x.g.remember(x.req, resp, createdAt)
	return resp, OutcomeExecuted, nil
}

// joinedOutcome checks, after the work returned, whether the answer it wrote
// through its own transaction (Complete) is committed. ok is false when it is
// not (the transaction rolled back), and the work's result is then handled as
// if Complete had not been called.
func (x *execution) joinedOutcome(ctx context.Context, resp Response) (Outcome, bool) {
	sctx, cancel := x.g.storeContext(ctx)
	defer cancel()
	rec, err := x.g.store.Get(sctx, x.req.Scope, x.req.Key)
	switch {
	case err == nil && rec.Owner == x.owner && rec.Answer != nil:
		x.g.tel.add(ctx, evExecuted)
		x.g.remember(x.req, Response(*rec.Answer), rec.CreatedAt)
		return OutcomeExecuted, true
	case err != nil && !errors.Is(err, durable.ErrNotFound):
		// Cannot tell whether the caller's transaction committed: keep the
		// key in progress (and the hybrid's lease) rather than risk a
		// second execution.
		x.holdLease(ctx)
		x.storeFailed(ctx, "read joined answer", err)
		x.g.tel.add(ctx, evPending)
		return OutcomeExecutedPending, true
	}
	return OutcomeNone, false
}

// insert writes the hybrid's durable row: finished with a, in progress with
// nil. It reports whether the row was written.
//
// Until the row is written, the lease is all that stops a retry from running
// the work again. So when a write fails, the lease is first extended to the
// store's retention (retries get 409, as in table mode, instead of running
// again once the lease's TTL is over), then the write is retried; if it goes
// through, the lease is released as usual.
func (x *execution) insert(ctx context.Context, a *durable.Answer) (durable.Record, bool) {
	var rec durable.Record
	err := x.retry(ctx, func(sctx context.Context) error {
		var err error
		rec, err = x.g.store.Insert(sctx, durable.ClaimParams{
			Scope: x.req.Scope, Key: x.req.Key, Fingerprint: x.req.Fingerprint, Owner: x.owner,
		}, a)
		return err
	})
	if err == nil {
		x.keepLease = false
		return rec, true
	}
	if errors.Is(err, durable.ErrExists) {
		// Another execution wrote the row while we held the lease: the lease
		// expired under us, or Redis lost it. Exactly-once was broken for this
		// key; make it loud.
		x.g.tel.add(ctx, evDoubleExecution)
		x.g.log.LogAttrs(ctx, slog.LevelError, "idem: row written by another execution while the lease was held; the work may have run twice",
			slog.String("key_hash", keyHash(x.req)))
		return durable.Record{}, false
	}
	x.holdLease(ctx)
	x.storeFailed(ctx, "insert", err)
	if x.lease != nil && x.extended && !errors.Is(err, durable.ErrInvalid) {
		x.g.storeLater(x.req, x.owner, a, x.lease)
	}
	return durable.Record{}, false
}

// storeLater keeps trying, in the background, to write the hybrid's durable
// row (finished with a, in progress with nil) after the write failed under
// the request, for up to StoreRetryFor or until Close. Once it is written the
// lease, which holds retries at 409 meanwhile, is released.
func (g *Guard) storeLater(req Request, owner durable.Token, a *durable.Answer, lease *lock.Lease) {
	if g.storeRetryFor <= 0 {
		return
	}
	g.bgMu.Lock()
	defer g.bgMu.Unlock()
	if g.bgClosed {
		return
	}
	var answer *durable.Answer
	if a != nil {
		c := *a
		answer = &c
	}
	p := durable.ClaimParams{Scope: req.Scope, Key: req.Key, Fingerprint: req.Fingerprint, Owner: owner}
	g.bg.Go(func() {
		log := g.log.With(slog.String("key_hash", keyHash(req)))
		deadline := time.Now().Add(g.storeRetryFor)
		pause := time.Second
		timer := time.NewTimer(pause)
		defer timer.Stop()
		for {
			select {
			case <-g.bgStop:
				log.Warn("idem: guard closed before the answer could be stored; the lease keeps the key in progress until it expires")
				return
			case <-timer.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), g.storeTimeout)
			_, err := g.store.Insert(ctx, p, answer)
			cancel()
			switch {
			case err == nil:
				rctx, cancel := context.WithTimeout(context.Background(), g.storeTimeout)
				rerr := lease.Release(rctx)
				cancel()
				log.Info("idem: answer stored after a failed write; retries are answered from the store again",
					slog.Bool("lease_released", rerr == nil))
				return
			case errors.Is(err, durable.ErrExists), errors.Is(err, durable.ErrInvalid):
				log.Error("idem: giving up storing the answer", slog.Any("error", err))
				return
			}
			if !time.Now().Add(pause).Before(deadline) {
				log.Error("idem: could not store the answer within StoreRetryFor; the lease keeps the key in progress until it expires",
					slog.String("lease", lease.Key()), slog.Any("error", err))
				return
			}
			pause = min(2*pause, 30*time.Second)
			timer.Reset(pause)
		}
	})
}

// Close stops the guard's background work, the retries of answers whose
// write failed (see Config.StoreRetryFor), and waits for it to end. Do,
// Settle and Release keep working after Close; answers whose write fails
// from then on are left to their extended leases. Safe to call more than
// once and concurrently.
func (g *Guard) Close() error {
	g.bgMu.Lock()
	if !g.bgClosed {
		g.bgClosed = true
		close(g.bgStop)
	}
	g.bgMu.Unlock()
	g.bg.Wait()
	return nil
}

// Writes of an answer after the work are tried storeAttempts times, with
// these pauses between tries, each bounded by StoreTimeout.
const storeAttempts = 3

var storeRetryPause = [storeAttempts - 1]time.Duration{100 * time.Millisecond, 400 * time.Millisecond}

// retry runs a write of the answer until it succeeds, fails for a reason a
// retry cannot change (the row is someone else's, already answered, or
// refused), or storeAttempts are spent. In hybrid mode the lease is extended
// before the first retry.
func (x *execution) retry(ctx context.Context, write func(context.Context) error) error {
	var err error
	for i := range storeAttempts {
		sctx, cancel := x.g.storeContext(ctx)
		t0 := x.g.tel.start()
		err = write(sctx)
		x.g.tel.since(ctx, phaseStore, t0)
		cancel()
		if err == nil || errors.Is(err, durable.ErrExists) || errors.Is(err, durable.ErrNotOwner) ||
			errors.Is(err, durable.ErrCompleted) || errors.Is(err, durable.ErrNotFound) || errors.Is(err, durable.ErrInvalid) {
			return err
		}
		if i == storeAttempts-1 {
			break
		}
		x.holdLease(ctx)
		t := time.NewTimer(storeRetryPause[i])
		<-t.C // the caller's cancellation does not stop the answer being stored
	}
	return err
}

// holdLease keeps the hybrid's lease past this request: it will not be
// released, and it is extended (once) to the store's retention, so that no
// retry runs the work again while its outcome is unrecorded.
func (x *execution) holdLease(ctx context.Context) {
	x.keepLease = true
	if x.lease == nil || x.extended {
		return
	}
	x.extended = true
	ttl := x.g.retention
	if ttl <= 0 {
		ttl = durable.DefaultRetention
	}
	rctx, cancel := x.g.storeContext(ctx)
	defer cancel()
	if err := x.lease.Refresh(rctx, ttl); err != nil {
		if errors.Is(err, lock.ErrNotHeld) {
			x.g.tel.add(ctx, evLockLost)
		}
		x.g.log.LogAttrs(ctx, slog.LevelError, "idem: lease could not be extended; once it expires a retry may run the work again",
			slog.String("key_hash", keyHash(x.req)), slog.Any("error", err))
		return
	}
	x.g.log.LogAttrs(ctx, slog.LevelWarn, "idem: lease extended to the retention while the answer is unrecorded; retries get 409 until the key is stored, the lease is deleted, or it expires",
		slog.String("key_hash", keyHash(x.req)), slog.String("lease", x.lease.Key()), slog.Duration("ttl", ttl))
}

func (x *execution) storeFailed(ctx context.Context, op string, err error) {
	x.g.tel.add(ctx, evStoreError)
	x.g.log.LogAttrs(ctx, slog.LevelError, "idem: answer not stored; the key stays in progress until settled or expired",
		slog.String("op", op), slog.String("strategy", string(x.mode)),
		slog.String("key_hash", keyHash(x.req)), slog.Any("error", err))
}

// abandon gives the key back: nothing happened (or the work panicked). In
// table mode the in-progress row is deleted; in hybrid mode there is no row
// yet and the lease is released by the caller.
func (x *execution) abandon(ctx context.Context) {
	if x.mode != StrategyTable {
		return
	}
	sctx, cancel := x.g.storeContext(ctx)
	defer cancel()
	if err := x.g.store.Release(sctx, x.req.Scope, x.req.Key, x.owner); err != nil {
		x.g.tel.add(ctx, evStoreError)
		x.g.log.LogAttrs(ctx, slog.LevelError, "idem: releasing the claim failed; the key stays in progress until released or expired",
			slog.String("key_hash", keyHash(x.req)), slog.Any("error", err))
	}
}
