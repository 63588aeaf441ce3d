// Package reconcile gives keys left in progress their real answer.
//
// A request whose work ended in a 5xx or an error ("we don't know whether the
// payment went through"), or whose process died mid-work, leaves its key in
// progress: every retry gets idem.ErrInProgress (409); such a key never
// expires. A [Reconciler] finds those keys once the execution that claimed
// each has ended for sure (the row's own hold, set by the Guard that claimed
// it, and [Config.MinAge], both counted on the Reconciler's own clock; see
// Finding due keys), and asks a [ResolveFunc] of yours what really happened,
// for example by asking the payment provider about the downstream key the
// request used. The answer decides:
//
//   - [Settled]: the answer is stored with [idem.Guard.Settle] and replayed to
//     the next retry;
//   - [NothingHappened]: the key is released with [idem.Guard.Release]; the
//     next retry runs the work, as the next attempt of the same intent (the
//     same Item.Intent, so the same derived names and downstream keys);
//   - [Unknown] (or an error, a panic, a timeout): the key is tried again
//     later, with exponential backoff kept in the database, so that it
//     survives restarts and changes of the instance that reconciles.
//
// A Reconciler works one instance at a time across a fleet (a lease per
// table, see durable.Store.Lead, which works through any connection pooler), so
// it is safe, and intended, to run one on every instance.
//
// Every execution holds a row in both strategies, so a process that dies
// mid-work, in either, leaves an in-progress row for the Reconciler: its
// retries get 409 until the ResolveFunc has said what happened.
//
// # Once per key, however the leader is paused
//
// Each decision (a settle, a release, a postponement) is applied by one
// statement that checks, with the row, both the attempt that was listed (its
// owner token: a key finished, released or claimed anew while the
// ResolveFunc worked is skipped) and the run's lease, on the database's clock
// alone (durable.Store.Lead). A leader paused longer than its lease (a
// SIGSTOP, a VM pause; the lease lasts 20s) cannot stop
// itself, and the next leader may resolve the same key meanwhile; when the
// paused one resumes, its decision changes nothing: it is dropped, counted in
// Result.Skipped, logged once, and its run ends with durable.ErrLeaseLost.
// So an attempt is settled or released at most once, by a leader whose lease
// was live when the decision was applied, and no later leader's decision is
// undone by an earlier one's. The ResolveFunc itself is not fenced: see its
// WARNING.
//
// # Usage
//
//	rec, err := reconcile.New(guard, store, func(ctx context.Context, it reconcile.Item) (reconcile.Decision, error) {
//		orderID := idem.DeriveID("ord_", "order", it.Intent) // as the work derived it
//		paymentKey, err := idem.DownstreamKey("order", orderID) // the key the work sent
//		if err != nil {
//			return reconcile.Decision{}, err
//		}
//		charge, found, err := provider.Lookup(ctx, paymentKey)
//		switch {
//		case err != nil:
//			return reconcile.Decision{}, err // unknown: try again later
//		case !found:
//			return reconcile.Decision{Verdict: reconcile.NothingHappened}, nil
//		}
//		return reconcile.Decision{Verdict: reconcile.Settled, Response: orderCreated(charge)}, nil
//	}, nil)
//	if err != nil { ... }
//	go rec.Run(ctx)
//
// Package pgidem builds and runs a Reconciler, with the Guard and the rest of
// a production setup, from its Config.Reconcile and a ResolveFunc.
//
// # Finding due keys
//
// No index lists in-progress rows, so that the answer write stays a HOT
// update. A run lists postponed keys whose backoff ended
// through a partial index on reconcile_after, then keys never looked at
// through the created_at index, over the rows created since the last run's
// scan less an overlap of MinAge, up to now - MinAge. Where that scan ended
// is kept in the table's <table>_reconcile row, so it survives restarts and
// changes of the reconciling instance. A claim whose commit reached the table
// more than twice MinAge after its statement began is not listed.
//
// A key is in progress while its work runs, too. The row carries how long
// the execution that holds it may run (its hold: hold_until less created_at,
// the MaxHold of the Guard that claimed it), and the
// Reconciler acts on a key only once that hold and [Config.MinAge] have both
// passed on its own monotonic clock since it first listed that attempt
// there. The database's clock only decides which rows are listed: one that
// steps forward lists a running key early, but cannot make it due, so Guards
// with different settings may share a table and a host's clock may step. A
// Reconciler that has not listed a key before (a new leader, a restart)
// counts afresh: a key left in progress is settled about MinAge after it is
// listed, which is MinAge after its claim on the database's clock, so about
// twice MinAge (plus up to one Interval) after its claim. MinAge must be
// longer than the Guard's MaxHold, and [New] refuses a shorter one. The
// store's retention must be longer than MinAge plus Interval.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/clock"
	"github.com/idemguard/idem/internal/periodic"
)

// Verdict is what a [ResolveFunc] learned about a key left in progress.
type Verdict int

const (
	// Unknown: the outcome is still unknown; the key stays in progress and
	// is tried again after a backoff. It is the zero Verdict, so a zero
	// Decision changes nothing.
	Unknown Verdict = iota
	// Settled: the request took effect; Decision.Response is its final
	// answer, stored and replayed to every retry. Its status must be one
	// the Guard stores: 100-499, not 429.
	Settled
	// NothingHappened: the request had no effect; the key is released and
	// the next retry runs the work.
	NothingHappened
)

// String returns "unknown", "settled" or "nothing_happened".
func (v Verdict) String() string {
	switch v {
	case Unknown:
		return "unknown"
	case Settled:
		return "settled"
	case NothingHappened:
		return "nothing_happened"
	}
	return fmt.Sprintf("verdict(%d)", int(v))
}

// Item is a key left in progress, as handed to a [ResolveFunc].
type Item struct {
	// Scope and Key name the intent, as in idem.Request.
	Scope, Key string
	// Fingerprint is the fingerprint of the request that claimed the key.
	Fingerprint idem.Fingerprint
	// Intent is the key's intent (see idem.Token), the one its work saw
	// through idem.ExecutionFromContext, the same in every attempt: derive
	// from it (idem.DeriveID) the names of what the work created, to look
	// them up.
	Intent idem.Token
	// Attempt is which attempt of the intent left the key in progress (1,
	// then one more per release), as idem.ExecutionFromContext told its work.
	// Names derived per attempt are to be looked up for every attempt up to
	// this one.
	Attempt int
	// CreatedAt is when the key was claimed, on the database clock.
	CreatedAt time.Time
	// Attempts is the number of earlier reconciliation attempts that could
	// not learn the outcome (Unknown, an error, a panic or a timeout). 0 the
	// first time.
	Attempts int
}

// Decision is a [ResolveFunc]'s answer. The zero Decision is Unknown.
type Decision struct {
	Verdict Verdict
	// Response is the final answer, for Settled only, in the form the
	// key's transport replays: the HTTP middleware sends it as it is;
	// grpcidem's interceptor sends the form grpcidem.Answer gives, and any
	// other through its Config.Render.
	Response idem.Response
}

// ResolveFunc learns the real outcome of a key left in progress. It must
// honour ctx, which ends after 10s. A returned error, like a
// panic or an invalid Decision, counts as Unknown: it is logged and the key
// is tried again after a backoff. A Reconciler calls it from one goroutine at
// a time.
//
// WARNING: across a fleet it may run twice at once for one key. A leader
// that is paused longer than its lease (a SIGSTOP, a VM pause: the lease
// lasts 20s) cannot stop its own code,
// and the next leader resolves the same key meanwhile. Only the decisions
// are fenced by the lease (the paused leader's is dropped, see the package
// doc); what the resolver does is not, and may land late, after the next
// leader's. Keep it a lookup; or make each of its writes conditional on what
// it read (a compare-and-set, as examples/checkout does for an order's
// status) or idempotent under the key (idem.DownstreamKey), so that running
// it twice, or late, does no harm.
type ResolveFunc func(ctx context.Context, it Item) (Decision, error)

// Guard is how a Reconciler settles and releases keys, each restricted to
// the attempt it listed, by its owner token (so a key released and claimed
// again by a new request meanwhile is left alone). *idem.Guard satisfies it:
// use the Guard that serves the requests, so that its stats, logs and
// metrics see the reconciler's actions. The ctx of Settle and Release
// carries the run's lease: passed on to the Guard's durable.Store (the one
// given to [New]), it fences the write (see durable.Store.Lead).
type Guard interface {
	Settle(ctx context.Context, scope, key string, owner idem.Token, resp idem.Response) error
	Release(ctx context.Context, scope, key string, owner idem.Token) error
	// MaxHold is the longest a running request keeps its key in progress.
	MaxHold() time.Duration
	// Logger is where the reconciler logs one line per action on a key
	// (keys appear only as key_hash, idem.KeyHash) and one per run that did
	// something: the Guard's Config.Logger.
	Logger() *slog.Logger
	// MeterProvider receives the reconciler's metrics (see New): the
	// Guard's Config.MeterProvider, nil for none.
	MeterProvider() metric.MeterProvider
}

// Store is the idempotency table a Reconciler works on. *durable.Store
// satisfies it: pass the store the Guard uses. The Reconciler lists due keys
// and keeps their backoff (reconcile_attempts and reconcile_after) through
// it (see durable.Store.ListPostponed and the methods beside it), and settles
// or releases them through the Guard.
type Store interface {
	// Table is the quoted, qualified table name, for the logs.
	Table() string
	// Lead runs fn while this instance holds the table's lease of job, one
	// instance at a time across a fleet, renewing it every tail; fn's
	// context carries the lease, which fences the writes made with it
	// (MarkScanned, Postpone, and the Guard's Settle and Release through the
	// same store). It returns an error wrapping durable.ErrLocked when
	// another instance holds it (see durable.Store.Lead).
	Lead(ctx context.Context, job string, tail time.Duration, fn func(ctx context.Context) error) error
	// Retention is how long a key lives after its answer or release; a key
	// in progress never expires. It must be longer than MinAge plus
	// Interval.
	Retention() time.Duration
	// ListPostponed lists up to limit in-progress keys whose backoff ended,
	// in the order it ended.
	ListPostponed(ctx context.Context, limit int) ([]durable.Due, error)
	// ScanWindow returns the window of a scan of keys never looked at: from
	// the last scan's mark less overlap to now - minAge.
	ScanWindow(ctx context.Context, minAge, overlap time.Duration) (from, to time.Time, err error)
	// ListNew lists up to limit in-progress keys never postponed, created
	// after the position of after and no later than to, oldest first.
	ListNew(ctx context.Context, after durable.Due, to time.Time, limit int) ([]durable.Due, error)
	// MarkScanned records that every key created at or before to has been
	// looked at; like Postpone, fenced by the lease ctx carries.
	MarkScanned(ctx context.Context, to time.Time) error
	// Postpone records attempts failed attempts on the listed attempt of a
	// key and hides it for delay; it changes nothing, with an error
	// wrapping durable.ErrLeaseLost, once the lease ctx carries has passed
	// (see durable.Store.Lead).
	Postpone(ctx context.Context, d durable.Due, attempts int, delay time.Duration) error
}

// Defaults of [Config].
const (
	DefaultInterval = 30 * time.Second
	DefaultMinAge   = time.Minute
)

// Config tunes a Reconciler. A nil *Config is valid and gives every default;
// a zero field takes its default and a negative one is refused.
type Config struct {
	// Interval is the time between the end of one run and the start of the
	// next. Defaults to 30s.
	Interval time.Duration
	// MinAge is how long a key must have been in progress before it is
	// reconciled: by the database's clock to be listed, then on the
	// Reconciler's own monotonic clock from that first listing, beside the
	// row's own hold (the reconciler never acts on a row before that has
	// passed too, whichever Guard claimed it). It must be longer than the
	// Guard's MaxHold and, with Interval, shorter than the store's
	// retention. Defaults to 1m (the Guard's default MaxHold is 46.5s).
	MinAge time.Duration
}

// settings are a Reconciler's Config with its defaults, and what it does
// the same way whatever its Config (the tests change it: export_test.go).
type settings struct {
	Interval, MinAge time.Duration
	// BatchSize is the number of keys listed per statement. A run handles
	// batches until no due key is left or ctx ends.
	BatchSize int
	// ResolveTimeout bounds each call of the ResolveFunc.
	ResolveTimeout time.Duration
	// BackoffBase is the wait after the first attempt that could not learn
	// a key's outcome; it doubles with every further attempt, up to
	// BackoffMax, without jitter. A key in progress never expires: retries
	// go on until the ResolveFunc learns the outcome.
	BackoffBase, BackoffMax time.Duration
	// StoreTimeout bounds each store and Guard call. A call that records a
	// decision already made runs even when the run's ctx is cancelled,
	// bounded by this timeout. It also sets the reconcile lease: renewed
	// every StoreTimeout during a run, for four times StoreTimeout, so a
	// reconciler that dies mid-run delays the next run on another instance
	// by up to that.
	StoreTimeout time.Duration
	// OnResult, when set, is called after every run that obtained the
	// lease (and every run that failed before it could).
	OnResult func(res Result, took time.Duration, err error)
}

// What a Reconciler does the same way whatever its Config.
const (
	batchSize      = 100
	resolveTimeout = 10 * time.Second
	backoffBase    = 30 * time.Second
	backoffMax     = time.Hour
	storeTimeout   = 5 * time.Second
)

// Result counts what one run did. Each key handled counts in exactly one
// field.
type Result struct {
	// Settled keys got their answer stored.
	Settled int
	// Released keys were released: their next retry runs the work, as the
	// next attempt of the same intent.
	Released int
	// Unknown keys were postponed because the ResolveFunc answered Unknown.
	Unknown int
	// Skipped keys were finished, released or taken over by a new request
	// (idem.ErrCompleted, ErrNotFound, ErrNotOwner) before the decision
	// could be applied: a normal race with a retry or with the request's
	// owner, not an error. A decision dropped because the run's lease had
	// passed when it reached the database counts here too: the key is left
	// to the instance that leads now, and the run's error (wrapping
	// durable.ErrLeaseLost) says why.
	Skipped int
	// Errors counts keys whose ResolveFunc failed (error, panic, timeout,
	// invalid Decision; such keys are postponed like Unknown ones) and keys
	// whose store or Guard call failed.
	Errors int
}

// Reconciler settles or releases keys left in progress. It is safe for
// concurrent use; [Reconciler.Run] may be running at most once per
// Reconciler at a time.
type Reconciler struct {
	guard   Guard
	store   Store
	resolve ResolveFunc
	cfg     settings
	log     *slog.Logger // the Guard's
	loop    periodic.Runner
	metrics metrics

	mu        sync.Mutex
	sightings map[attempt]sighting // see wait
}

// attempt names one attempt of a key: its owner token is drawn by its claim.
type attempt struct {
	scope, key string
	owner      idem.Token
}

// sighting is when, on the Reconciler's monotonic clock, it first and last
// listed an attempt.
type sighting struct{ first, last time.Time }

// New returns a Reconciler that settles and releases keys through guard,
// finds them in store (the Guard's store, which also holds its lease, see
// durable.Store.Lead), and asks resolve what happened. It logs to the Guard's
// Logger and measures through its MeterProvider: the counter
// "idem.reconcile.keys" by result (settled, released, unknown, skipped,
// error), the counter "idem.reconcile.runs" and the histogram
// "idem.reconcile.duration" (seconds), both by outcome (ok, error, stopped),
// for every run that obtained the lease. A nil cfg gives every default.
// Invalid fields are reported by name.
//
// Each run lists due keys 100 at a time, gives a ResolveFunc 10s, and backs
// a key whose outcome is still unknown off for 30s, doubled per attempt up
// to an hour; its lease lasts 20s, renewed every 5s.
func New(guard Guard, store Store, resolve ResolveFunc, cfg *Config) (*Reconciler, error) {
	switch {
	case guard == nil:
		return nil, errors.New("reconcile: nil guard")
	case store == nil:
		return nil, errors.New("reconcile: nil store")
	case resolve == nil:
		return nil, errors.New("reconcile: nil resolve func")
	}
	var cc Config
	if cfg != nil {
		cc = *cfg
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"Interval", cc.Interval}, {"MinAge", cc.MinAge}} {
		if f.v < 0 {
			return nil, fmt.Errorf("reconcile: Config.%s: must not be negative, got %v", f.name, f.v)
		}
	}
	c := settings{Interval: cc.Interval, MinAge: cc.MinAge, BatchSize: batchSize, ResolveTimeout: resolveTimeout,
		BackoffBase: backoffBase, BackoffMax: backoffMax, StoreTimeout: storeTimeout}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.MinAge == 0 {
		c.MinAge = DefaultMinAge
	}
	switch hold := guard.MaxHold(); {
	case hold <= 0:
		return nil, fmt.Errorf("reconcile: the Guard's MaxHold %v bounds nothing: running requests could be settled under their feet", hold)
	case c.MinAge <= hold:
		return nil, fmt.Errorf("reconcile: Config.MinAge %v: must be longer than the Guard's MaxHold %v, or running requests could be settled under their feet", c.MinAge, hold)
	}
	if ret := store.Retention(); ret <= c.MinAge+c.Interval {
		return nil, fmt.Errorf("reconcile: Config.MinAge %v + Config.Interval %v: must be shorter than the store's retention %v, or a settled key could expire before a client that waited for it returns",
			c.MinAge, c.Interval, ret)
	}
	m, err := newMetrics(guard.MeterProvider())
	if err != nil {
		return nil, fmt.Errorf("reconcile: the Guard's MeterProvider: %w", err)
	}
	return &Reconciler{
		guard:     guard,
		store:     store,
		resolve:   resolve,
		cfg:       c,
		log:       guard.Logger(),
		metrics:   m,
		sightings: make(map[attempt]sighting),
	}, nil
}

// Run reconciles now, then again Interval after the end of each run, until
// ctx ends. Each run is [Reconciler.RunOnce]; a failed run is logged and
// measured, and does not stop Run.
//
// When ctx ends, Run stops after the key in hand (a decision already made is
// still recorded), gives the lease back and returns nil. It returns an error
// only when Run is already running on this Reconciler.
func (r *Reconciler) Run(ctx context.Context) error {
	if !r.loop.Run(ctx, r.cfg.Interval, func(ctx context.Context) { _, _ = r.RunOnce(ctx) }) {
		return errors.New("reconcile: Reconciler.Run is already running")
	}
	return nil
}

// RunOnce runs one reconciliation, for cron-style use. Under the table's
// reconcile lease, it lists due keys a batch at a time and handles
// each: resolve, then settle, release or postpone. Due keys are, in this
// order: postponed keys whose backoff ended, in the order it ended; then keys
// in progress for longer than MinAge that no run has looked at yet, oldest
// first. It stops when no due key is left (or only keys it already handled in
// this run, whose store calls failed).
//
// It returns what it did. The error is nil when the run went through, even if
// some keys failed (they are counted in Result.Errors and logged); it wraps
// durable.ErrLocked when another instance holds the table's reconcile lease
// (it is reconciling right now: nothing was done, a normal outcome when a
// Reconciler runs on every instance), the context's error when ctx ended,
// durable.ErrLeaseLost when the lease could not be renewed (the run stopped,
// as if cancelled, before the lease could expire) or had passed when a
// decision reached the database (the decision was dropped; see the package
// doc), or the store's error when listing failed.
func (r *Reconciler) RunOnce(ctx context.Context) (Result, error) {
	start := time.Now()
	var res Result
	// Once its ctx is cancelled, a run goes on acting for at most one
	// StoreTimeout: the call recording a decision already made.
	err := r.store.Lead(ctx, "reconcile", r.cfg.StoreTimeout, func(ctx context.Context) error {
		return r.run(ctx, &res)
	})
	took := time.Since(start)
	if errors.Is(err, durable.ErrLocked) {
		r.log.LogAttrs(ctx, slog.LevelDebug, "idem: reconcile skipped, another instance holds the lease",
			slog.String("table", r.store.Table()))
		return res, fmt.Errorf("reconcile: %w", err)
	}
	if err != nil {
		err = fmt.Errorf("reconcile: %w", err)
	}
	r.report(ctx, res, took, err)
	return res, err
}

// run lists and handles due keys on db, while holding the reconcile lease:
// first the postponed keys whose backoff ended, then the keys
// never looked at, from where the last run's scan ended (less an overlap of
// MinAge) to now - MinAge. It then marks where this scan ended, or, when a
// key could be neither settled, released nor postponed, just before that key,
// so that the next run lists it again.
func (r *Reconciler) run(ctx context.Context, res *Result) error {
	seen := make(map[attempt]bool)
	// handleAll handles the keys of batch not seen yet in this run. It
	// reports how many it handled, and the first one still due after it.
	handleAll := func(batch []durable.Due) (handled int, stuck *durable.Due, err error) {
		for i, d := range batch {
			id := attempt{d.Scope, d.Key, d.Owner}
			if seen[id] {
				continue
			}
			if err := ctx.Err(); err != nil {
				return handled, stuck, err
			}
			seen[id] = true
			handled++
			done, err := r.handle(ctx, d, res)
			if err != nil {
				return handled, stuck, err
			}
			if !done && stuck == nil {
				stuck = &batch[i]
			}
		}
		return handled, stuck, nil
	}
	// call runs one statement under StoreTimeout; a failure after ctx ended
	// is ctx's.
	call := func(fn func(ctx context.Context) error) error {
		sctx, cancel := context.WithTimeout(ctx, r.cfg.StoreTimeout)
		defer cancel()
		err := fn(sctx)
		if cerr := ctx.Err(); err != nil && cerr != nil {
			return cerr
		}
		return err
	}

	for {
		var batch []durable.Due
		if err := call(func(ctx context.Context) (err error) {
			batch, err = r.store.ListPostponed(ctx, r.cfg.BatchSize)
			return err
		}); err != nil {
			return err
		}
		// A key whose postponement failed is listed again: seen.
		handled, _, err := handleAll(batch)
		if err != nil {
			return err
		}
		if len(batch) < r.cfg.BatchSize || handled == 0 {
			break
		}
	}

	var from, to time.Time
	if err := call(func(ctx context.Context) (err error) {
		from, to, err = r.store.ScanWindow(ctx, r.cfg.MinAge, r.cfg.MinAge)
		return err
	}); err != nil {
		return err
	}
	mark := to
	for pos, marked := (durable.Due{CreatedAt: from}), false; ; {
		var batch []durable.Due
		if err := call(func(ctx context.Context) (err error) {
			batch, err = r.store.ListNew(ctx, pos, to, r.cfg.BatchSize)
			return err
		}); err != nil {
			return err
		}
		_, stuck, err := handleAll(batch)
		if err != nil {
			return err // stopped: the next run scans this window again
		}
		if stuck != nil && !marked {
			mark, marked = stuck.CreatedAt.Add(-time.Microsecond), true
		}
		if len(batch) < r.cfg.BatchSize {
			break
		}
		pos = batch[len(batch)-1]
	}
	if err := call(func(ctx context.Context) error { return r.store.MarkScanned(ctx, mark) }); err != nil {
		return fmt.Errorf("mark the scan: %w", err)
	}
	r.forgetStale(clock.Now(ctx))
	return nil
}

// wait reports how much longer, on the Reconciler's own monotonic clock, it
// must leave the listed attempt d alone: the attempt's hold (d.Hold) and
// MinAge, each counted from when this Reconciler first listed that owner on that key.
// Only this process's clock decides: a database clock that stepped forward
// lists a live attempt early, but cannot make it due. A Reconciler that has
// not seen an attempt before (a new leader, a restart) counts afresh, which
// delays a key, never settles one early; an owner token is drawn by its
// claim, so a sighting proves the claim came before it.
func (r *Reconciler) wait(ctx context.Context, d durable.Due) time.Duration {
	now := clock.Now(ctx)
	id := attempt{d.Scope, d.Key, d.Owner}
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.sightings[id]
	if !ok {
		s.first = now.Add(-clock.HeadStart(ctx))
	}
	s.last = now
	r.sightings[id] = s
	return max(d.Hold, r.cfg.MinAge) - now.Sub(s.first)
}

// forget drops the sighting of an attempt that is no longer due.
func (r *Reconciler) forget(d durable.Due) {
	r.mu.Lock()
	delete(r.sightings, attempt{d.Scope, d.Key, d.Owner})
	r.mu.Unlock()
}

// forgetStale drops the sightings of attempts not listed for longer than a
// postponed key can stay hidden (BackoffMax) and two runs more: finished by
// someone else, or never due again. Dropping a sighting too early only makes
// the next listing count afresh.
func (r *Reconciler) forgetStale(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, s := range r.sightings {
		if now.Sub(s.last) > r.cfg.BackoffMax+2*r.cfg.Interval+r.cfg.MinAge {
			delete(r.sightings, id)
		}
	}
}

// handle resolves one key and applies the decision, counting it in res. It
// reports whether the key is no longer due: settled, released, postponed, or
// changed by someone else. Its error, which ends the run, wraps
// durable.ErrLeaseLost when the decision was refused because this run's lease
// had passed by the time it reached the database (see dropped).
func (r *Reconciler) handle(ctx context.Context, d durable.Due, res *Result) (bool, error) {
	log := r.log.With(slog.String("key_hash", idem.KeyHash(d.Scope, d.Key)))
	if left := r.wait(ctx, d); left > 0 {
		// The execution that holds the key may still run, whatever the
		// database's clock says: leave it due, untouched, and look again
		// at the next run.
		log.LogAttrs(ctx, slog.LevelDebug, "idem: reconcile leaves a key alone until its hold has passed on its own clock",
			slog.Duration("left", left))
		return false, nil
	}
	it := Item{Scope: d.Scope, Key: d.Key, Fingerprint: d.Fingerprint, Intent: d.Intent,
		Attempt: d.Attempt, CreatedAt: d.CreatedAt, Attempts: d.Attempts}
	dec, err := r.call(ctx, it)
	if err == nil {
		err = dec.validate()
	}
	if ctx.Err() != nil {
		// Stopping: the resolver was cut short. Leave the key due, untouched.
		return false, nil
	}
	// The decision is made: record it even if ctx ends from now on. ctx
	// carries the run's lease (durable.Store.Lead): each write is fenced by
	// it, so none lands once the lease has passed, however long this
	// process was paused.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.StoreTimeout)
	defer cancel()

	if err != nil {
		log.LogAttrs(ctx, slog.LevelWarn, "idem: reconcile resolver failed; the key stays in progress",
			slog.Int("attempts", it.Attempts), slog.Any("error", err))
		postponed, due, lost := r.postpone(sctx, log, d, Unknown, res)
		if postponed {
			res.Errors++
		}
		return !due, lost
	}
	switch dec.Verdict {
	case Unknown:
		postponed, due, lost := r.postpone(sctx, log, d, Unknown, res)
		if postponed {
			res.Unknown++
		}
		return !due, lost
	case Settled, NothingHappened:
		if dec.Verdict == Settled {
			err = r.guard.Settle(sctx, d.Scope, d.Key, d.Owner, dec.Response)
		} else {
			err = r.guard.Release(sctx, d.Scope, d.Key, d.Owner)
		}
		if err == nil || gone(err) {
			r.forget(d)
		}
		switch {
		case errors.Is(err, durable.ErrLeaseLost):
			return false, r.dropped(ctx, log, dec.Verdict, err, res)
		case gone(err):
			res.Skipped++
			log.LogAttrs(ctx, slog.LevelDebug, "idem: reconcile skipped a key finished meanwhile",
				slog.String("verdict", dec.Verdict.String()), slog.Any("error", err))
		case err != nil:
			res.Errors++
			log.LogAttrs(ctx, slog.LevelError, "idem: reconcile could not apply its decision; the key stays in progress",
				slog.String("verdict", dec.Verdict.String()), slog.Any("error", err))
			// A failing call must not be retried at every run: back off.
			_, due, lost := r.postpone(sctx, log, d, dec.Verdict, &Result{})
			return !due, lost
		case dec.Verdict == Settled:
			res.Settled++
			log.LogAttrs(ctx, slog.LevelInfo, "idem: reconcile settled a key",
				slog.Int("status", dec.Response.Status), slog.Int("attempts", it.Attempts),
				slog.Duration("age", time.Since(d.CreatedAt)))
		default:
			res.Released++
			log.LogAttrs(ctx, slog.LevelInfo, "idem: reconcile released a key; its next retry runs",
				slog.Int("attempts", it.Attempts), slog.Duration("age", time.Since(d.CreatedAt)))
		}
	}
	return true, nil
}

// dropped counts and logs a decision refused by its fence: this run's lease
// had passed when the decision reached the database (the process was paused
// longer than the lease, or could not renew it), so another instance may
// lead and be resolving the key. The decision is dropped, the key is left
// to whoever leads now, and the run ends with err, once: every later write
// of the run would be refused too.
func (r *Reconciler) dropped(ctx context.Context, log *slog.Logger, v Verdict, err error, res *Result) error {
	res.Skipped++
	log.LogAttrs(ctx, slog.LevelWarn, "idem: reconcile dropped its decision: its lease had passed when the decision reached the database; the key is left to the instance that leads now",
		slog.String("verdict", v.String()), slog.Any("error", err))
	return err
}

// call runs the resolver with its timeout, turning a panic into an error.
func (r *Reconciler) call(ctx context.Context, it Item) (dec Decision, err error) {
	rctx, cancel := context.WithTimeout(ctx, r.cfg.ResolveTimeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("reconcile: resolver panicked: %v\n%s", p, debug.Stack())
		}
	}()
	return r.resolve(rctx, it)
}

func (d Decision) validate() error {
	switch d.Verdict {
	case Unknown, NothingHappened:
		return nil
	case Settled:
		s := d.Response.Status
		if s < 100 || s > 499 || s == http.StatusTooManyRequests {
			return fmt.Errorf("reconcile: resolver settled with status %d, which is never stored (use 100-499 but 429)", s)
		}
		return nil
	}
	return fmt.Errorf("reconcile: resolver returned an invalid verdict %d", int(d.Verdict))
}

// postpone records one more failed attempt and hides the key for its
// backoff, after a decision v (Unknown, or one that could not be applied).
// It reports whether the key was postponed, and whether it is still due: it
// is not when postponed or changed by someone else meanwhile (counted in res
// as skipped); it is when the store failed (counted as an error). lost, which
// ends the run, wraps durable.ErrLeaseLost when the postponement was refused
// by this run's lease (see dropped).
func (r *Reconciler) postpone(ctx context.Context, log *slog.Logger, d durable.Due, v Verdict, res *Result) (postponed, due bool, lost error) {
	attempts := d.Attempts + 1
	delay := r.backoff(attempts)
	err := r.store.Postpone(ctx, d, attempts, delay)
	switch {
	case errors.Is(err, durable.ErrLeaseLost):
		return false, true, r.dropped(ctx, log, v, err, res)
	case gone(err):
		r.forget(d)
		res.Skipped++
		log.LogAttrs(ctx, slog.LevelDebug, "idem: reconcile skipped a key finished or taken over meanwhile")
		return false, false, nil
	case err != nil:
		res.Errors++
		log.LogAttrs(ctx, slog.LevelError, "idem: reconcile could not postpone the key", slog.Any("error", err))
		return false, true, nil
	}
	log.LogAttrs(ctx, slog.LevelInfo, "idem: reconcile could not learn the outcome; will try again",
		slog.Int("attempts", attempts), slog.Duration("retry_in", delay))
	return true, false, nil
}

// backoff is the wait after the given number of failed attempts (1 or more):
// BackoffBase doubled attempts-1 times, capped at BackoffMax.
func (r *Reconciler) backoff(attempts int) time.Duration {
	d := r.cfg.BackoffBase
	for i := 1; i < attempts && d < r.cfg.BackoffMax; i++ {
		d *= 2
	}
	return min(d, r.cfg.BackoffMax)
}

func (r *Reconciler) report(ctx context.Context, res Result, took time.Duration, err error) {
	attrs := []slog.Attr{
		slog.String("table", r.store.Table()),
		slog.Int("settled", res.Settled), slog.Int("released", res.Released),
		slog.Int("unknown", res.Unknown), slog.Int("skipped", res.Skipped),
		slog.Int("errors", res.Errors), slog.Duration("took", took),
	}
	outcome := "ok"
	switch {
	case err != nil && ctx.Err() != nil:
		outcome = "stopped"
		r.log.LogAttrs(ctx, slog.LevelInfo, "idem: reconcile stopped", attrs...)
	case err != nil:
		outcome = "error"
		r.log.LogAttrs(ctx, slog.LevelError, "idem: reconcile failed", append(attrs, slog.Any("error", err))...)
	case res != (Result{}):
		r.log.LogAttrs(ctx, slog.LevelInfo, "idem: reconcile run", attrs...)
	default:
		r.log.LogAttrs(ctx, slog.LevelDebug, "idem: reconcile found nothing to do", attrs...)
	}
	r.metrics.record(ctx, res, took, outcome)
	if r.cfg.OnResult != nil {
		r.cfg.OnResult(res, took, err)
	}
}

// gone reports whether err says that the key is no longer the in-progress
// row that was listed: a normal race, not a failure.
func gone(err error) bool {
	return errors.Is(err, idem.ErrCompleted) || errors.Is(err, idem.ErrNotFound) ||
		errors.Is(err, idem.ErrNotOwner)
}
