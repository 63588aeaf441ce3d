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
// Every execution holds a durable row in PostgreSQL (package durable): the
// claim, INSERT ... ON CONFLICT (user_id, key) DO NOTHING, decides who runs,
// and the unique constraint is the last line of defence. Two strategies put
// different filters in front of it:
//
//   - table (no lock configured): the claim alone. One PostgreSQL write to
//     claim and one to store the answer per first execution; one read-only
//     round trip per replay.
//   - hybrid ([Config.Lock] set): a lease in Redis (package lock) first,
//     which carries the key's state, so that retries of a running key,
//     reused keys and replays are answered with one Redis round trip and no
//     PostgreSQL statement, and retry storms never reach the claim. The
//     request that gets the lease still claims its row, so Redis is a
//     filter, never the fence: a lost lease, a Redis outage, a partition or
//     a fleet mixing both strategies cannot run the work twice. While
//     duplicates are rare, requests claim first, as in the table strategy,
//     and the lease only receives copies of answers (one Redis write no
//     request waits for).
//
// A stored answer is durable before the client reads it: the middleware
// sends it once the store has committed it (durable.Store waits for the
// commit's flush), so every retry gets that answer, through a crash of the
// store too. docs/strategies.md states exactly which faults can still re-run work
// or turn an answer into a 409, strategy by strategy.
package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemguard/idem/internal/rare"
)

// Locker is the lease service of the hybrid strategy. *lock.Locker (package
// lock, over Redis) implements it; taking it as an interface keeps Redis out
// of a table-only program. A lease's state is opaque to the Locker: the Guard
// writes what it knows about the key there (running under a fingerprint, a
// copy of the committed answer) and reads it back to answer requests that
// must not run.
type Locker interface {
	// TryLock takes the lease of the intent (scope, key) with state as its
	// value, without waiting, in one round trip. When it obtains the lease
	// it returns a function that replaces the lease's state and TTL (0
	// keeps the remaining TTL) or, given a nil state, deletes it, both only
	// while the lease is still the caller's; when another holder has it, it
	// returns the state held, how long ago that lease was taken (measured
	// by the lease service's own clock against the TTL its writer gave it,
	// negative when the service cannot tell: the Guard then reads the
	// row), and a nil function. It returns an
	// error when the service could not answer in time (the guard then
	// claims without a lease) or ctx ended. The function reports an error
	// only when it could not reach the service: a lease no longer held is
	// left alone.
	TryLock(ctx context.Context, scope, key string, state []byte) (held []byte, age time.Duration, replace func(ctx context.Context, state []byte, ttl time.Duration) error, err error)
	// Set writes state as the lease of (scope, key) for ttl, whoever holds
	// it, without waiting for the service: every call made through the
	// Locker after Set returns reaches the service after the write, and
	// answered (never nil) is called once with the write's error, nil when
	// it was written or dropped because ttl ran out first. answered must
	// not block.
	Set(scope, key string, state []byte, ttl time.Duration, answered func(error))
	// Delete removes the lease of (scope, key), whoever holds it.
	Delete(ctx context.Context, scope, key string) error
	// Shutdown refuses every call from now on and returns once the calls
	// made before have been answered, the writes of Set included, or ctx
	// has ended, with an error wrapping ctx.Err().
	Shutdown(ctx context.Context) error
}

// Waiter wakes a request that waits for a key's answer instead of being
// refused with 409 (see Config.Wait). *durable.Listener implements it, over
// PostgreSQL LISTEN/NOTIFY.
type Waiter interface {
	// Subscribe returns a channel that receives when the answer of (scope,
	// key) may have been stored or the key released, and a function that
	// ends the subscription. Wake-ups may be spurious: the guard reads the
	// key again after each.
	Subscribe(scope, key string) (wake <-chan struct{}, cancel func())
}

// Config tunes a Guard. A nil *Config is valid: the table strategy with every
// default.
type Config struct {
	// Lock, when set, selects the hybrid strategy: a lease (a *lock.Locker
	// over Redis) filters retries before the durable claim. Defaults to nil
	// (table strategy).
	Lock Locker
	// WorkTimeout bounds the work's context, from the claim on. Together
	// with StoreTimeout it bounds how long a request keeps its key in
	// progress (see Guard.MaxHold). The lease of the hybrid strategy may
	// end before the work does: retries then reach the durable claim,
	// which still refuses them. Defaults to 20s.
	WorkTimeout time.Duration
	// StoreTimeout bounds each call to the store. The calls made after the
	// work (storing its answer, releasing its key) run even if the caller's
	// context is cancelled, so a client that hangs up does not lose the
	// answer. Defaults to 5s.
	StoreTimeout time.Duration
	// Logger receives one line per decision worth a human's attention
	// (fallback to the table claim, store failure, an answer written that
	// differs from the one joined); a store failure that repeats is logged
	// once per cause and 10s, with the count of the requests it refused
	// meanwhile. Keys are logged as a hash (see
	// KeyHash), never in clear. It is also the logger of the reconciler
	// and of grpcidem's interceptor built over the Guard (Guard.Logger).
	// Defaults to slog.Default().
	Logger *slog.Logger
	// MeterProvider, when set, receives the guard's metrics through the
	// OpenTelemetry metric API: the counter "idem.events" by event
	// (executed, executed_unstored, released, replayed, in_progress,
	// key_reused, key_missing, key_invalid, settled, fallback, store_error,
	// double_execution, answer_mismatch, overrun, cache_hit, waited,
	// wait_timeout, wait_refused, lease_answered, claim_first) and the histogram
	// "idem.phase.duration" of the guard's own steps (lock, claim, read,
	// store, lease). Defaults to nil: no metrics and no cost
	// beyond the atomic counters behind Stats.
	MeterProvider metric.MeterProvider
	// TracerProvider, when set, gives every Do (so the middleware and
	// grpcidem too) a span "idem.request" with the attributes idem.strategy,
	// idem.key_hash (KeyHash, never the key or scope), idem.attempt (when
	// a row was read: not on a replay from the cache or the lease) and
	// idem.outcome, and the events lock, claim, read, store (the answer's
	// write), lease and lease_queued (the answer's copy to the hybrid's
	// lease, sent in the background) for the guard's own steps. A replay's span is linked
	// to the span of the execution whose answer it replays, best-effort:
	// the link is kept in process for the last 4096 executions only, so a
	// replay served by another instance, after a restart or after eviction
	// has no link, nor has the replay of an answer stored by Settle. Defaults to nil: no span and no cost.
	TracerProvider trace.TracerProvider
	// CacheSize, when positive, keeps up to that many finished answers in an
	// in-process LRU for up to a minute, so that a retry storm on a hot key
	// is replayed (or refused with ErrKeyReused) without any round trip.
	// In-progress state is never cached, and an entry never outlives its
	// key's retention in the store. Defaults to 0: no cache.
	//
	// WARNING: an answer deleted from the store by hand is still replayed by
	// every instance that cached it, for up to a minute.
	CacheSize int
	// Waiter wakes the requests that wait for a running key's answer (see
	// Wait). *durable.Listener is one; the store must announce answers
	// (durable.Config.Notify) on every instance. Defaults to nil.
	Waiter Waiter
	// Wait lets a retry that finds its key running wait up to Wait for the
	// answer, woken by the Waiter, and replay it instead of being refused
	// with ErrInProgress (409); if the key is released meanwhile, the retry
	// runs the work itself. A key waiting for reconciliation (ErrPending) is
	// never waited for, and at most 1024 requests wait at once on a Guard
	// (the others are refused at once). Waiters hold no database connection.
	// It needs a Waiter and must be shorter than MaxHold; keep it below the
	// client's own timeout. Defaults to 0: no request waits.
	Wait time.Duration
}

const (
	defaultStoreTimeout = 5 * time.Second
	defaultWorkTimeout  = 20 * time.Second
	// cacheTTL bounds how long an answer stays in the cache (CacheSize).
	cacheTTL = time.Minute
	// maxWaiters bounds how many requests wait at once on a Guard (Wait),
	// so that a retry storm on a slow key cannot pile up.
	maxWaiters = 1024
)

// Guard runs work at most once per (scope, key). It is safe for concurrent use
// by any number of goroutines and holds no per-request state.
type Guard struct {
	store        Store
	lock         Locker
	workTimeout  time.Duration
	storeTimeout time.Duration
	log          *slog.Logger
	meter        metric.MeterProvider // Config.MeterProvider, for the parts built around the Guard
	retention    time.Duration        // the store's: bounds cache entries and MaxHold
	cache        *answerCache         // nil without Config.CacheSize
	tel          telemetry
	traces       *tracing // nil without Config.TracerProvider
	waiter       Waiter
	wait         time.Duration // how long a retry of a running key waits; 0 with no Waiter
	maxWaiters   int64         // maxWaiters; the tests change it (export_test.go)
	waiting      atomic.Int64
	redis        redisBreaker // hybrid: a recent failure of the lease service
	repeats      repeatLog    // which store failures are logged
	stopped      atomic.Bool  // hybrid: Shutdown has begun, the lease is left alone
	mode         *rare.Window // hybrid: claim first while duplicates are rare (mode.go)
}

// New returns a Guard over store. A nil cfg gives the table strategy with every
// default. As in every Config of idem's packages, a zero field takes its
// default and a negative one is refused. Invalid fields are reported by
// name, and so is a store whose retention is not longer than the guard's
// MaxHold: a key could then expire, and be claimed again, while its first
// execution still runs.
func New(store Store, cfg *Config) (*Guard, error) {
	if store == nil {
		return nil, errors.New("idem: nil store")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	for _, f := range []struct {
		name     string
		negative bool
		v        any
	}{{"StoreTimeout", c.StoreTimeout < 0, c.StoreTimeout}, {"WorkTimeout", c.WorkTimeout < 0, c.WorkTimeout},
		{"CacheSize", c.CacheSize < 0, c.CacheSize}, {"Wait", c.Wait < 0, c.Wait}} {
		if f.negative {
			return nil, fmt.Errorf("idem: Config.%s must not be negative, got %v", f.name, f.v)
		}
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = defaultStoreTimeout
	}
	if c.WorkTimeout == 0 {
		c.WorkTimeout = defaultWorkTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	g := &Guard{
		store:        store,
		lock:         c.Lock,
		workTimeout:  c.WorkTimeout,
		storeTimeout: c.StoreTimeout,
		log:          c.Logger,
		meter:        c.MeterProvider,
		retention:    store.Retention(),
		waiter:       c.Waiter,
		wait:         c.Wait,
		maxWaiters:   maxWaiters,
		mode:         rare.New(leaseWindow, leaseEnter, leaseLeave),
	}
	hold := g.MaxHold()
	if g.retention <= hold {
		return nil, fmt.Errorf("idem: the store's retention %v must be longer than the Guard's MaxHold %v (Config.WorkTimeout %v + store calls), or a running key could expire and be claimed again",
			g.retention, hold, c.WorkTimeout)
	}
	switch {
	case c.Wait > 0 && c.Waiter == nil:
		return nil, fmt.Errorf("idem: Config.Wait %v needs a Config.Waiter: without one no request waits, and every retry of a running key is refused at once", c.Wait)
	case c.Wait >= hold:
		return nil, fmt.Errorf("idem: Config.Wait %v must be shorter than the Guard's MaxHold %v: past it the key waits for reconciliation, which no retry waits for", c.Wait, hold)
	}
	if c.CacheSize > 0 {
		g.cache = newAnswerCache(c.CacheSize, cacheTTL)
	}
	if err := g.tel.init(c.MeterProvider); err != nil {
		return nil, fmt.Errorf("idem: Config.MeterProvider: %w", err)
	}
	g.traces = newTracing(c.TracerProvider, g.Strategy())
	g.tel.traced = g.traces != nil
	return g, nil
}

// Logger returns the Guard's Config.Logger (slog.Default() when unset): the
// one logger of the parts built around the Guard (the reconciler, grpcidem's
// interceptor, and what pgidem wires).
func (g *Guard) Logger() *slog.Logger { return g.log }

// MeterProvider returns the Guard's Config.MeterProvider (nil when unset):
// the one provider of the parts built around the Guard (the reconciler, and
// what pgidem wires).
func (g *Guard) MeterProvider() metric.MeterProvider { return g.meter }

// Strategy reports how the guard decides who runs: "table" (the durable
// claim alone) or "hybrid" (a lease, Config.Lock, filters retries before the
// same durable claim).
func (g *Guard) Strategy() string {
	if g.lock != nil {
		return "hybrid"
	}
	return "table"
}

// Do runs work at most once for req's (Scope, Key) and returns its answer, or
// the stored answer of an earlier execution with the same fingerprint. The
// Outcome says which; read it first:
//
//   - OutcomeExecuted: the work ran and its answer is stored. err is nil.
//   - OutcomeExecutedUnstored: the work ran and its answer is not stored (a
//     5xx, an error, an answer that could not be written): the key stays in
//     progress until it is settled. err is the work's own error, if any, or
//     one wrapping ErrInvalid when the answer cannot be stored as it is (a
//     header value that is not valid UTF-8).
//   - OutcomeExecutedReleased: the work ran and said nothing happened; the
//     key was released. err is the work's own error, if any (ErrRetrySafe
//     when it returned that).
//   - OutcomeReplayed: resp is the stored answer. err is nil.
//   - OutcomeInProgress: the work did not run; err is ErrInProgress while
//     another request runs, or ErrPending when the key waits for
//     reconciliation (errors.Is(ErrPending, ErrInProgress) holds).
//   - OutcomeKeyReused: the work did not run; err is ErrKeyReused.
//   - OutcomeNone: the work did not run; err wraps ErrUnavailable or
//     ErrInvalidRequest, or is the context's error.
//
// A retry that finds its key running waits for the answer when Config.Wait
// is set (see there) and is refused with ErrInProgress otherwise.
//
// If work panics, the key stays in progress (the panic may have come after
// a side effect) unless the work called MarkRetrySafe first, and the panic
// continues.
func (g *Guard) Do(ctx context.Context, req Request, work Work) (Response, Outcome, error) {
	if err := req.validate(); err != nil {
		return Response{}, OutcomeNone, err
	}
	if work == nil {
		return Response{}, OutcomeNone, errors.New("idem: nil work")
	}
	if g.traces != nil {
		ctx, span, h := g.traces.start(ctx, req)
		resp, out, err := g.doWait(ctx, req, work)
		g.traces.end(span, h, out, err)
		return resp, out, err
	}
	return g.doWait(ctx, req, work)
}

// doWait is Do once the request is checked: one decision, then a wait for a
// running key's answer when the Guard waits.
func (g *Guard) doWait(ctx context.Context, req Request, work Work) (Response, Outcome, error) {
	resp, out, err := g.do(ctx, req, work)
	if out == OutcomeInProgress && g.wait > 0 && !errors.Is(err, ErrPending) {
		return g.waitFor(ctx, req, work, err)
	}
	return resp, out, err
}

// do is one decision: the cache, then the strategy.
func (g *Guard) do(ctx context.Context, req Request, work Work) (Response, Outcome, error) {
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
	return g.claimAndRun(ctx, req, work, nil)
}

// waitFor subscribes to the key, then decides again after every wake-up until
// the key is no longer running, Config.Wait has passed or ctx has ended.
// Subscribing before deciding again means no announcement can fall between
// the two.
func (g *Guard) waitFor(ctx context.Context, req Request, work Work, refusal error) (Response, Outcome, error) {
	if g.waiting.Add(1) > g.maxWaiters {
		g.waiting.Add(-1)
		g.tel.add(ctx, evWaitRefused)
		return Response{}, OutcomeInProgress, refusal
	}
	defer g.waiting.Add(-1)
	wake, cancel := g.waiter.Subscribe(req.Scope, req.Key)
	defer cancel()
	timer := time.NewTimer(g.wait)
	defer timer.Stop()
	for {
		// The row, not the lease: an answer's copy reaches Redis only after
		// the commit that woke us.
		resp, out, err := g.claimAndRun(ctx, req, work, nil)
		if out != OutcomeInProgress || errors.Is(err, ErrPending) {
			g.tel.add(ctx, evWaited)
			return resp, out, err
		}
		select {
		case <-wake:
		case <-timer.C:
			g.tel.add(ctx, evWaitTimeout)
			return resp, out, err
		case <-ctx.Done():
			return resp, out, err
		}
	}
}

// decide answers a request whose key already has a row: a different
// fingerprint first (422, whatever the row's state), then no answer yet (409),
// else replay. read is when the statement that returned rec was sent.
func (g *Guard) decide(ctx context.Context, req Request, rec Record, read time.Time) (Response, Outcome, error) {
	switch {
	case rec.Fingerprint != req.Fingerprint:
		g.tel.add(ctx, evKeyReused)
		return Response{}, OutcomeKeyReused, ErrKeyReused
	case rec.Answer == nil:
		g.tel.add(ctx, evInProgress)
		if time.Now().After(g.holdEnds(rec, read)) {
			// The execution that claimed the key has ended for sure (its
			// own deadline, whichever Guard claimed it): its outcome is
			// unknown until a reconciler settles it.
			return Response{}, OutcomeInProgress, ErrPending
		}
		return Response{}, OutcomeInProgress, ErrInProgress
	}
	g.tel.add(ctx, evReplayed)
	g.traces.attempt(ctx, rec.Attempt)
	resp := *rec.Answer
	g.remember(req, resp, read.Add(rec.TTL))
	return resp, OutcomeReplayed, nil
}

// holdEnds is when, on the local monotonic clock, the execution that holds
// rec's attempt has ended for sure, rec having been read by a statement sent
// at read. The store tells how long the attempt may hold the key (HoldUntil
// less CreatedAt, both its claim's now) and how old it was (Age, on the
// store's clock): only durations, which this Guard counts down from read,
// so no host's clock is compared with the database's.
func (g *Guard) holdEnds(rec Record, read time.Time) time.Time {
	return read.Add(rec.HoldUntil.Sub(rec.CreatedAt) - rec.Age)
}

// remember caches a finished answer of a key that expires in the store at
// expires, on the local monotonic clock (see Record.TTL), so that it
// leaves the cache before the key does.
func (g *Guard) remember(req Request, resp Response, expires time.Time) {
	if g.cache == nil {
		return
	}
	g.cache.put(req, cloneResponse(resp), expires)
}

func (g *Guard) storeFailed(ctx context.Context, req Request, op string, err error) (Response, Outcome, error) {
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(err, cerr) { // the store's error says so already
			return Response{}, OutcomeNone, &wrapError{cause: err}
		}
		return Response{}, OutcomeNone, &wrapError{kind: cerr, cause: err}
	}
	if errors.Is(err, ErrInvalid) {
		// Do validates every field first, so this is a store with stricter
		// rules than the guard's.
		return Response{}, OutcomeNone, &RequestError{Field: "Request", Reason: "refused by the store: " + err.Error()}
	}
	g.tel.add(ctx, evStoreError)
	// One line per cause and repeatInterval while it lasts, with the count
	// of the refusals it stands for: an outage is not a line per request.
	if log, held := g.repeats.allow(op+": "+err.Error(), time.Now()); log {
		attrs := []slog.Attr{slog.String("op", op), slog.String("key_hash", keyHash(req)), slog.Any("error", err)}
		if held > 0 {
			attrs = append(attrs, slog.Int("repeated", held), slog.Duration("within", repeatInterval))
		}
		g.log.LogAttrs(ctx, slog.LevelError, "idem: store unavailable, failing closed", attrs...)
	}
	return Response{}, OutcomeNone, &wrapError{kind: ErrUnavailable, cause: err}
}

// storeContext is the context of a store call made on behalf of a request
// that may already have been cancelled: the answer must still be written.
// It is bounded by StoreTimeout from now; cancel it when the call returns.
func (g *Guard) storeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), g.storeTimeout)
}

// MaxHold is the longest a request keeps its key in progress, measured from
// its claim: the claim's own round trip, the WorkTimeout and a second's
// grace for the work to return, the check of a joined answer, and every
// attempt to write the answer or release the key, each bounded by
// StoreTimeout (a claim whose reply was lost is given back within it too). A reconciler must
// leave keys younger than this alone, and the store's retention must be
// longer.
//
// WARNING: work that ignores its context's deadline can run past MaxHold.
// The guard cannot stop it; it logs the overrun and counts it ("overrun"),
// and the owner-checked answer write then fails if a reconciler released
// or settled the key meanwhile.
func (g *Guard) MaxHold() time.Duration {
	return g.workTimeout + overrunGrace + (2+storeAttempts)*g.storeTimeout + storeRetryPauses()
}

// Settle stores the final answer of a key left in progress (by a 5xx, an
// error, a crash), so that its next retry is replayed resp. In the hybrid
// strategy the key's lease then holds a copy of it, read back from the row.
// Use it once the real outcome is known, and only once the attempt's
// execution has ended (the row's HoldUntil has passed; a reconciler waits for
// it). It acts only on the attempt whose owner token is owner (the row's
// Owner, as the store's Get returns it; a reconciler passes the one it
// listed): a key released and claimed again meanwhile is another attempt, and
// Settle then returns ErrNotOwner and changes nothing. It returns ErrNotFound
// when no live row exists (or it was released) and ErrCompleted when the key
// already has another answer; settling the same answer twice is not an
// error. resp must be storable (100-499 but 429).
func (g *Guard) Settle(ctx context.Context, scope, key string, owner Token, resp Response) error {
	if disposition(resp, nil) != dispStore {
		return fmt.Errorf("idem: settle: status %d cannot be stored (5xx and 429 never are)", resp.Status)
	}
	if err := g.store.Complete(ctx, scope, key, owner, resp); err != nil {
		return &wrapError{op: "settle", cause: err}
	}
	if g.lock != nil {
		g.copySettled(ctx, scope, key)
	}
	g.tel.add(ctx, evSettled)
	g.log.LogAttrs(ctx, slog.LevelInfo, "idem: key settled",
		slog.String("key_hash", KeyHash(scope, key)), slog.Int("status", resp.Status))
	return nil
}

// Release releases a key left in progress, declaring that its attempt had no
// effect: the next retry runs the work, as the next attempt of the same
// intent (the same intent Token, so the same DeriveID names and
// DownstreamKey), and the same key with another request is still refused
// (ErrKeyReused). Like Settle it acts only on the attempt of owner
// (ErrNotOwner otherwise), returns ErrNotFound when no live row exists or it
// was released already, and ErrCompleted when the key has an answer, which
// is never released. In the hybrid strategy the key's lease is deleted too.
func (g *Guard) Release(ctx context.Context, scope, key string, owner Token) error {
	if err := g.store.Release(ctx, scope, key, owner); err != nil {
		return err // the store's error names the operation: "durable: release: ..."
	}
	if g.lock != nil {
		g.dropLease(ctx, Request{Scope: scope, Key: key})
	}
	g.tel.add(ctx, evReleased)
	g.log.LogAttrs(ctx, slog.LevelInfo, "idem: key released",
		slog.String("key_hash", KeyHash(scope, key)))
	return nil
}

// copySettled puts the answer a key was just settled with in its lease, as
// read back from the row; when the row cannot be read, it deletes the lease,
// so that the next request claims and finds the answer.
func (g *Guard) copySettled(ctx context.Context, scope, key string) {
	req := Request{Scope: scope, Key: key}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.storeTimeout)
	t0 := time.Now()
	rec, err := g.store.Get(sctx, scope, key)
	cancel()
	if err != nil || rec.Answer == nil {
		g.dropLease(ctx, req)
		return
	}
	g.copyAnswer(ctx, req, rec.Fingerprint, *rec.Answer, t0.Add(rec.TTL))
}
