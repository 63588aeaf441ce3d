package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemguard/idem/durable"
)

// doHybrid puts a Redis lease in front of the durable claim. SET NX EX
// decides "somebody has this key" at Redis speed: a request that does not
// get the lease reads the row (replay, 422, or 409 while it runs) and writes
// nothing. The request that gets it claims the durable row like the table
// strategy, so PostgreSQL still decides who runs.
//
// The lease is kept after the request, until its TTL: retries in that time
// take the read path, which costs less than a claim. It is given back when
// the key is released by its own execution (nothing happened) or when the
// claim could not be made; a key released or expired otherwise leaves a
// lease with no row behind, and the read path then claims (readDecide).
func (g *Guard) doHybrid(ctx context.Context, req Request, work Work) (Response, Outcome, error) {
	start := time.Now()
	release, err := g.lock.TryLock(ctx, req.Scope, req.Key)
	g.tel.since(ctx, phaseLock, start)
	switch {
	case err != nil && ctx.Err() != nil:
		return Response{}, OutcomeNone, fmt.Errorf("idem: lock: %w", err) // the caller's context ended
	case err != nil:
		// Safe: every execution holds a durable row, and this claim
		// competes with theirs.
		g.tel.add(ctx, evFallback)
		g.log.LogAttrs(ctx, slog.LevelWarn, "idem: lease service unavailable, falling back to the table claim",
			slog.String("key_hash", keyHash(req)), slog.Any("error", err))
		return g.claimAndRun(ctx, req, work, nil)
	case release == nil:
		return g.readDecide(ctx, req, work)
	}
	resp, out, err := g.claimAndRun(ctx, req, work, release)
	if out == OutcomeNone {
		// The claim failed: nothing holds the key, so neither may the lease.
		g.releaseLease(ctx, req, release)
	}
	return resp, out, err
}

// readDecide answers a request that did not get the lease from the durable
// row. With no row, the lease is either a holder's that has not claimed yet
// or one left behind by a key released or expired since: the durable claim
// tells them apart, so this request claims (without a lease) and either
// runs or, losing to the holder, is told 409.
func (g *Guard) readDecide(ctx context.Context, req Request, work Work) (Response, Outcome, error) {
	sctx := new(bounded)
	t0 := time.Now()
	sctx.start(ctx, t0.Add(g.storeTimeout))
	rec, err := g.store.Get(sctx, req.Scope, req.Key)
	sctx.end()
	g.tel.since(ctx, phaseRead, t0)
	switch {
	case err == nil:
		return g.decide(ctx, req, rec)
	case errors.Is(err, durable.ErrNotFound):
		return g.claimAndRun(ctx, req, work, nil)
	}
	return g.storeFailed(ctx, req, "read", err)
}

// releaseLease gives the lease back; a failure only delays retries until the
// lease's TTL, so it is logged and not reported.
func (g *Guard) releaseLease(ctx context.Context, req Request, release func(context.Context) error) {
	rctx := g.storeContext(ctx)
	defer rctx.end()
	t0 := g.tel.start()
	err := release(rctx)
	g.tel.since(ctx, phaseRelease, t0)
	if err != nil {
		g.log.LogAttrs(ctx, slog.LevelWarn, "idem: releasing lease failed; retries read the row until it expires",
			slog.String("key_hash", keyHash(req)), slog.Any("error", err))
	}
}
