package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// doHybrid answers a request of the hybrid strategy: the lease first, or,
// while duplicates are rare, the claim first (mode.go).
func (g *Guard) doHybrid(ctx context.Context, req Request, work Work) (Response, Outcome, error) {
	var resp Response
	var out Outcome
	var err error
	if g.mode.Rare() && !g.leaseOff() {
		g.tel.add(ctx, evClaimFirst)
		resp, out, err = g.claimAndRun(ctx, req, work, nil)
	} else {
		resp, out, err = g.leaseFirst(ctx, req, work)
	}
	dup := out == OutcomeReplayed || out == OutcomeInProgress || out == OutcomeKeyReused
	if out != OutcomeNone && g.mode.Observe(dup) {
		g.log.LogAttrs(ctx, slog.LevelDebug, "idem: the hybrid switched lease modes", slog.Bool("claim_first", g.mode.Rare()))
	}
	return resp, out, err
}

// leaseFirst puts a Redis lease in front of the durable claim. One round
// trip either takes the lease (state leaseClaiming, with this request's
// fingerprint) or returns the state another request left there, which
// answers the retries of a running key (409), reused keys (422) and replays
// without PostgreSQL (see lease.go). The request that gets the lease claims
// the durable row like the table strategy, so PostgreSQL still decides who
// runs; when the claim finds a row, the lease is replaced by what the row
// says.
//
// After a Redis failure the guard goes straight to the table claim for a
// second (redisBreaker): a stalled Redis then costs one request per second its
// timeout, not every request.
func (g *Guard) leaseFirst(ctx context.Context, req Request, work Work) (Response, Outcome, error) {
	if g.stopped.Load() || !g.redis.allow() {
		g.tel.add(ctx, evFallback)
		return g.claimAndRun(ctx, req, work, nil)
	}
	start := time.Now()
	held, age, lease, err := g.lock.TryLock(ctx, req.Scope, req.Key, encodeLease(leaseClaiming, req.Fingerprint))
	g.tel.since(ctx, phaseLock, start)
	switch {
	case err != nil && ctx.Err() != nil:
		return Response{}, OutcomeNone, fmt.Errorf("idem: %w", err) // the caller's context ended; err names the lock's op
	case err != nil:
		// Safe: every execution holds a durable row, and this claim
		// competes with theirs.
		g.redisFailed(ctx, req, "lock", err)
		g.tel.add(ctx, evFallback)
		return g.claimAndRun(ctx, req, work, nil)
	}
	g.redis.ok()
	if lease == nil {
		return g.answerFromLease(ctx, req, work, held, age)
	}
	resp, out, err := g.claimAndRun(ctx, req, work, lease)
	if out == OutcomeNone {
		// The claim failed: nothing holds the key, so neither may the lease.
		g.leaseWrite(ctx, req, "release lease", func(ctx context.Context) error { return lease(ctx, nil, 0) })
	}
	return resp, out, err
}

// answerFromLease answers a request that did not get the lease from the
// state the lease holds, or from the row when the state cannot tell: an
// unverified state under another fingerprint, an answer too large to copy,
// or an in-progress state older than staleLease, or of an age the lease
// service cannot tell (negative), which may have outlived its answer (a copy
// lost, a key answered by an instance without Redis).
func (g *Guard) answerFromLease(ctx context.Context, req Request, work Work, held []byte, age time.Duration) (Response, Outcome, error) {
	st, ok := decodeLease(held)
	inProgress := st.kind == leaseClaiming || st.kind == leaseRunning || st.kind == leasePending
	switch {
	case !ok, st.kind == leaseClaiming && st.fp != req.Fingerprint, st.kind == leaseDone && st.fp == req.Fingerprint:
		return g.readDecide(ctx, req, work, false)
	case st.fp != req.Fingerprint:
		g.tel.add(ctx, evLeaseAnswered)
		g.tel.add(ctx, evKeyReused)
		return Response{}, OutcomeKeyReused, ErrKeyReused
	case st.kind == leaseAnswer:
		g.tel.add(ctx, evLeaseAnswered)
		g.tel.add(ctx, evReplayed)
		return st.resp, OutcomeReplayed, nil
	case inProgress && (age < 0 || age > staleLease):
		return g.readDecide(ctx, req, work, true)
	}
	g.tel.add(ctx, evLeaseAnswered)
	g.tel.add(ctx, evInProgress)
	if st.kind == leasePending {
		return Response{}, OutcomeInProgress, ErrPending
	}
	return Response{}, OutcomeInProgress, ErrInProgress
}

// staleLease is the age past which an in-progress state of the lease is
// checked against the row before it refuses a request: it bounds how long a
// lost copy, or a key answered without Redis, is refused with 409 after its
// answer is known, at the price of one read per retry of a key that runs
// longer than this.
const staleLease = 5 * time.Second

// readDecide answers a request from the durable row when the lease cannot.
// With no row, the lease is a holder's that has not claimed yet, or one left
// behind by a key released since: the durable claim tells them apart, so this
// request claims (without a lease) and either runs or, losing to the holder,
// is told 409. refresh puts an answer found in the row into the lease, for a
// lease whose state was stale.
func (g *Guard) readDecide(ctx context.Context, req Request, work Work, refresh bool) (Response, Outcome, error) {
	sctx, cancel := context.WithTimeout(ctx, g.storeTimeout)
	t0 := time.Now()
	rec, err := g.store.Get(sctx, req.Scope, req.Key)
	cancel()
	g.tel.since(ctx, phaseRead, t0)
	switch {
	case err == nil:
		if refresh && rec.Answer != nil {
			g.copyAnswer(ctx, req, rec.Fingerprint, *rec.Answer, t0.Add(rec.TTL))
		}
		return g.decide(ctx, req, rec, t0)
	case errors.Is(err, ErrNotFound):
		return g.claimAndRun(ctx, req, work, nil)
	}
	return g.storeFailed(ctx, req, "read", err)
}

// leaseFromRow replaces the lease of a request whose claim found a row with
// what the row says, so that the next requests are answered as the row
// would answer them: its answer, or that it is in progress (pending when
// pending is true) under its own fingerprint. read is when the statement
// that returned rec was sent.
func (g *Guard) leaseFromRow(ctx context.Context, req Request, lease leaseFunc, rec Record, pending bool, read time.Time) {
	if rec.Answer == nil {
		kind := leaseRunning
		if pending {
			kind = leasePending
		}
		g.leaseWrite(ctx, req, "replace lease", func(ctx context.Context) error {
			return lease(ctx, encodeLease(kind, rec.Fingerprint), 0)
		})
		return
	}
	g.copyAnswer(ctx, req, rec.Fingerprint, *rec.Answer, read.Add(rec.TTL))
}

// copyAnswer puts the committed answer of a key in its lease, for at most
// leaseAnswerTTL and never past expires, the key's expiry in the store
// counted on the local monotonic clock (see Record.TTL). It does not wait for
// Redis: the copy goes out with the Locker's next exchange, before any later
// command of this Guard's, so that this Guard's next request for the key
// finds it; another instance's request may still find the earlier state
// until the copy lands (a 409 where the copy would replay). A lost copy only
// sends replays to PostgreSQL.
func (g *Guard) copyAnswer(ctx context.Context, req Request, fp Fingerprint, a Response, expires time.Time) {
	ttl := min(time.Until(expires), leaseAnswerTTL)
	if ttl < time.Millisecond || g.leaseOff() {
		return
	}
	lctx := context.WithoutCancel(ctx) // for the metric and the log line, once the copy is answered
	t0 := g.tel.start()
	if g.traces != nil {
		// The copy is answered after the request's span has ended, as a
		// rule: its queueing is the event.
		trace.SpanFromContext(ctx).AddEvent("lease_queued")
	}
	g.lock.Set(req.Scope, req.Key, encodeAnswerLease(fp, a), ttl, func(err error) {
		g.tel.since(lctx, phaseLease, t0)
		if err != nil {
			g.redisFailed(lctx, req, "copy answer", err)
			return
		}
		g.redis.ok()
	})
}

// dropLease deletes the lease of a key that was released, whoever holds it:
// "nothing happened" must not be answered 409 from a stale state.
func (g *Guard) dropLease(ctx context.Context, req Request) {
	if g.leaseOff() {
		return
	}
	g.leaseWrite(ctx, req, "delete lease", func(ctx context.Context) error {
		return g.lock.Delete(ctx, req.Scope, req.Key)
	})
}

// leaseWrite runs a write to the lease service on behalf of a request that
// may already have been cancelled. A failure only sends the key's next
// requests to PostgreSQL, or has them refused until the lease's TTL, so it
// is logged and not reported.
func (g *Guard) leaseWrite(ctx context.Context, req Request, op string, write func(context.Context) error) {
	if g.stopped.Load() {
		return
	}
	t0 := g.tel.start()
	err := write(context.WithoutCancel(ctx))
	g.tel.since(ctx, phaseLease, t0)
	if err != nil {
		g.redisFailed(ctx, req, op, err)
		return
	}
	g.redis.ok()
}

// leaseOff reports whether the lease is to be left alone: Redis failed a
// moment ago, or the Guard is shut down.
func (g *Guard) leaseOff() bool { return g.stopped.Load() || g.redis.down() }

// Shutdown ends the hybrid's use of Redis, for a clean stop: requests from
// now on claim their row without a lease (counted as fallback, not logged),
// as after a Redis failure, and Shutdown returns once what the lease
// service had queued has been sent and answered (the answers' copies, which
// no request waits for), or ctx has ended first, with an error wrapping
// ctx.Err(). Call it once the server has stopped taking requests
// (http.Server.Shutdown has returned) and before closing the Redis client:
// a request still running keeps its answer in PostgreSQL but writes no copy
// (its retries elsewhere are refused 409 for up to 5 s, then read the row).
// It is safe to call more than once and concurrently with Do; on the table
// strategy it does nothing.
func (g *Guard) Shutdown(ctx context.Context) error {
	if g.lock == nil {
		return nil
	}
	g.stopped.Store(true)
	if err := g.lock.Shutdown(ctx); err != nil {
		return fmt.Errorf("idem: %w", err) // err names the lock's op
	}
	return nil
}

func (g *Guard) redisFailed(ctx context.Context, req Request, op string, err error) {
	g.redis.fail()
	g.log.LogAttrs(ctx, slog.LevelWarn, "idem: lease service unavailable, falling back to the table claim for a second",
		slog.String("op", op), slog.String("key_hash", keyHash(req)), slog.Any("error", err))
}

// leaseFunc replaces the state of a held lease (0 keeps its TTL), or deletes
// it when state is nil: see Locker.
type leaseFunc = func(ctx context.Context, state []byte, ttl time.Duration) error

// redisCooldown is how long the hybrid leaves Redis alone after a failure.
const redisCooldown = time.Second

// redisBreaker remembers a recent failure of the lease service. Closed (zero)
// it lets every call through; open, it refuses calls until the cooldown
// ends, then lets one call through as a probe, whose success closes it.
type redisBreaker struct {
	openUntil atomic.Int64 // nanoseconds on the monotonic clock since epoch; 0: closed
}

// epoch anchors the breaker's monotonic times.
var epoch = time.Now()

func (b *redisBreaker) fail() { b.openUntil.Store(int64(time.Since(epoch) + redisCooldown)) }

func (b *redisBreaker) ok() {
	if b.openUntil.Load() != 0 {
		b.openUntil.Store(0)
	}
}

// down reports whether the breaker is open, without taking the probe.
func (b *redisBreaker) down() bool {
	u := b.openUntil.Load()
	return u != 0 && int64(time.Since(epoch)) < u
}

// allow reports whether a request may ask Redis: always when closed; once
// per cooldown when open.
func (b *redisBreaker) allow() bool {
	u := b.openUntil.Load()
	if u == 0 {
		return true
	}
	now := int64(time.Since(epoch))
	return now >= u && b.openUntil.CompareAndSwap(u, now+int64(redisCooldown))
}
