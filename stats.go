package idem

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Stats counts a Guard's decisions since it was created. Every field only
// grows.
type Stats struct {
	Executed         uint64 // work ran, answer stored
	Unstored         uint64 // work ran, answer unknown or not stored: key left in progress
	Released         uint64 // keys released: work declared nothing happened, or Guard.Release
	Replayed         uint64 // stored answer returned (from the store or the cache)
	InProgress       uint64 // refused with ErrInProgress
	KeyReused        uint64 // refused with ErrKeyReused
	KeyMissing       uint64 // middleware: request without Idempotency-Key refused
	KeyInvalid       uint64 // middleware: unusable Idempotency-Key refused
	Settled          uint64 // Guard.Settle calls that stored an answer
	Fallbacks        uint64 // hybrid requests that fell back to the table claim (Redis unavailable)
	StoreErrors      uint64 // store calls that failed (claim, read, complete, release)
	DoubleExecutions uint64 // claims found released or taken over while their work ran: the work may have run twice
	AnswerMismatches uint64 // work that returned an answer other than the one it completed through Complete
	Overruns         uint64 // work that returned more than a second after its deadline
	CacheHits        uint64 // answers served by the local cache, without a round trip
	Waited           uint64 // requests that waited for a running key and got its outcome
	WaitTimeouts     uint64 // requests that waited for a running key until their bound, then got 409
	WaitsRefused     uint64 // requests refused a wait because 1024 already waited
	LeaseAnswers     uint64 // hybrid: requests answered from the Redis lease, without PostgreSQL (409, 422, replay)
	ClaimsFirst      uint64 // hybrid: requests that claimed their row without consulting the lease, duplicates being rare
}

// event is something the Guard counts, in Stats and as a metric.
type event int

const (
	evExecuted event = iota
	evUnstored
	evReleased
	evReplayed
	evInProgress
	evKeyReused
	evKeyMissing
	evKeyInvalid
	evSettled
	evFallback
	evStoreError
	evDoubleExecution
	evAnswerMismatch
	evOverrun
	evCacheHit
	evWaited
	evWaitTimeout
	evWaitRefused
	evLeaseAnswered
	evClaimFirst
	numEvents
)

var eventNames = [numEvents]string{
	evExecuted: "executed", evUnstored: "executed_unstored", evReleased: "released",
	evReplayed: "replayed", evInProgress: "in_progress", evKeyReused: "key_reused",
	evKeyMissing: "key_missing", evKeyInvalid: "key_invalid", evSettled: "settled",
	evFallback: "fallback", evStoreError: "store_error",
	evDoubleExecution: "double_execution", evAnswerMismatch: "answer_mismatch", evOverrun: "overrun",
	evCacheHit: "cache_hit", evWaited: "waited", evWaitTimeout: "wait_timeout", evWaitRefused: "wait_refused",
	evLeaseAnswered: "lease_answered", evClaimFirst: "claim_first",
}

// phase is a timed step of the guard's own work.
type phase int

const (
	phaseLock  phase = iota // Redis SET NX
	phaseClaim              // PostgreSQL claim
	phaseRead               // PostgreSQL read (hybrid, lease not obtained)
	phaseStore              // PostgreSQL write of the answer
	phaseLease              // Redis lease write: answer copy, replace, delete
	numPhases
)

var phaseNames = [numPhases]string{"lock", "claim", "read", "store", "lease"}

// telemetry holds the counters behind Stats and, when a MeterProvider is
// configured, the OpenTelemetry instruments. Without a MeterProvider it costs
// one atomic add per event and nothing else.
type telemetry struct {
	counts  [numEvents]atomic.Uint64
	enabled bool
	traced  bool // Config.TracerProvider: each phase is an event of the request's span
	events  metric.Int64Counter
	phases  metric.Float64Histogram
	evOpts  [numEvents]metric.AddOption
	phOpts  [numPhases]metric.RecordOption
}

func (t *telemetry) init(mp metric.MeterProvider) error {
	if mp == nil {
		return nil
	}
	m := mp.Meter("github.com/idemguard/idem")
	var err error
	t.events, err = m.Int64Counter(MetricEvents,
		metric.WithDescription("Decisions and incidents of the idempotency guard, by event."),
		metric.WithUnit("{event}"))
	if err != nil {
		return err
	}
	t.phases, err = m.Float64Histogram(MetricPhase,
		metric.WithDescription("Duration of the guard's own steps (lock, claim, read, store, lease)."),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
	if err != nil {
		return err
	}
	for i := range t.evOpts {
		t.evOpts[i] = metric.WithAttributeSet(attribute.NewSet(attribute.String("event", eventNames[i])))
	}
	for i := range t.phOpts {
		t.phOpts[i] = metric.WithAttributeSet(attribute.NewSet(attribute.String("phase", phaseNames[i])))
	}
	t.enabled = true
	return nil
}

func (t *telemetry) add(ctx context.Context, e event) {
	t.counts[e].Add(1)
	if t.enabled {
		t.events.Add(ctx, 1, t.evOpts[e])
	}
}

// start returns the time a phase starts, or the zero time when no metrics
// are recorded (so that nothing is measured for nothing).
func (t *telemetry) start() time.Time {
	if !t.enabled && !t.traced {
		return time.Time{}
	}
	return time.Now()
}

func (t *telemetry) since(ctx context.Context, p phase, start time.Time) {
	if t.enabled {
		t.phases.Record(ctx, time.Since(start).Seconds(), t.phOpts[p])
	}
	if t.traced {
		trace.SpanFromContext(ctx).AddEvent(phaseNames[p])
	}
}

// Stats returns a snapshot of the counters. Safe to call concurrently.
func (g *Guard) Stats() Stats {
	c := &g.tel.counts
	return Stats{
		Executed: c[evExecuted].Load(), Unstored: c[evUnstored].Load(), Released: c[evReleased].Load(),
		Replayed: c[evReplayed].Load(), InProgress: c[evInProgress].Load(), KeyReused: c[evKeyReused].Load(),
		KeyMissing: c[evKeyMissing].Load(), KeyInvalid: c[evKeyInvalid].Load(),
		Settled: c[evSettled].Load(), Fallbacks: c[evFallback].Load(), StoreErrors: c[evStoreError].Load(),
		DoubleExecutions: c[evDoubleExecution].Load(), AnswerMismatches: c[evAnswerMismatch].Load(),
		Overruns: c[evOverrun].Load(), CacheHits: c[evCacheHit].Load(),
		Waited: c[evWaited].Load(), WaitTimeouts: c[evWaitTimeout].Load(), WaitsRefused: c[evWaitRefused].Load(),
		LeaseAnswers: c[evLeaseAnswered].Load(), ClaimsFirst: c[evClaimFirst].Load(),
	}
}

func newToken() Token {
	var t Token
	_, _ = rand.Read(t[:]) // never fails (crypto/rand.Read documents so since Go 1.24)
	return t
}

// KeyHash names the intent (scope, key) without revealing the key: the
// unpadded base64url of HashParts(scope, key), 43 characters. It is the one
// hash of (scope, key) of the module: every log line of the guard, the
// reconciler and grpcidem carries it as "key_hash", package lock's Redis key
// holds it, and durable's notifications name the key by it. Compute it for a
// known key to find its lines and its lease.
func KeyHash(scope, key string) string {
	fp := HashParts([]byte(scope), []byte(key))
	return base64.RawURLEncoding.EncodeToString(fp[:])
}

func keyHash(req Request) string { return KeyHash(req.Scope, req.Key) }
