package idem

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// claimAndRun is the table strategy, and the fence under every hybrid lease:
// the durable claim (INSERT ... ON CONFLICT DO NOTHING) decides who runs.
// The winner runs the work and writes its answer under its owner token; a
// loser is answered from the row it found (422, 409 or a replay).
//
// lease is the hybrid's lease, held by this request; nil in table mode,
// after a fallback, or on the read path. A claim that finds a row replaces
// the lease with what the row says.
func (g *Guard) claimAndRun(ctx context.Context, req Request, work Work, lease leaseFunc) (Response, Outcome, error) {
	owner := newToken()
	// t0 is when the claim was sent: the row's TTL counts down from it.
	t0 := time.Now()
	cctx, cancel := context.WithTimeout(ctx, g.storeTimeout)
	rec, claimed, err := g.store.Claim(cctx, ClaimParams{
		// No Intent: a new key's intent is its first owner token, which
		// keeps the row as narrow as before (the store writes no intent
		// then); every later attempt gets an owner token of its own and
		// keeps the intent.
		Scope: req.Scope, Key: req.Key, Fingerprint: req.Fingerprint, Owner: owner,
		Hold: g.MaxHold(),
	})
	cancel()
	g.tel.since(ctx, phaseClaim, t0)
	if err != nil {
		if ambiguous(err) {
			g.giveBack(ctx, req, owner)
		}
		return g.storeFailed(ctx, req, "claim", err)
	}
	if !claimed {
		resp, out, err := g.decide(ctx, req, rec, t0)
		switch {
		case lease != nil && !rec.ReleasedAt.IsZero():
			// A released row refused another request (422): no claim
			// holds the key, so neither may the lease.
			g.leaseWrite(ctx, req, "release lease", func(ctx context.Context) error { return lease(ctx, nil, 0) })
		case lease != nil:
			g.leaseFromRow(ctx, req, lease, rec, errors.Is(err, ErrPending), t0)
		}
		return resp, out, err
	}
	x := &execution{g: g, req: req, owner: owner, intent: rec.Intent, attempt: rec.Attempt, expires: t0.Add(rec.TTL)}
	return x.run(ctx, work)
}

// ambiguous reports whether a failed claim may have committed all the same:
// its reply did not come back in time (StoreTimeout, a stalled synchronous
// standby) or the caller gave up while it was out. An error the store
// returned, or a refused connection, says nothing was written.
func ambiguous(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// giveBackTimeout bounds the release of a claim that may have committed.
const giveBackTimeout = time.Second

// giveBack releases, owner-checked and best effort, a claim that may have
// committed although the claim call failed, so that the key is not left in
// progress with no execution behind it until a reconciler finds it: the work
// never ran, so nothing happened. When the claim did not commit there is
// nothing of this owner's to release, and the store says so.
func (g *Guard) giveBack(ctx context.Context, req Request, owner Token) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(g.storeTimeout, giveBackTimeout))
	err := g.store.Release(rctx, req.Scope, req.Key, owner)
	cancel()
	switch {
	case err == nil:
		g.tel.add(ctx, evReleased)
		g.log.LogAttrs(ctx, slog.LevelWarn, "idem: a claim whose reply was lost had committed; released it, the work did not run",
			slog.String("key_hash", keyHash(req)))
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrNotOwner):
		// The claim did not commit (or not yet): nothing to give back.
	default:
		g.log.LogAttrs(ctx, slog.LevelWarn, "idem: could not release a claim whose reply was lost; if it committed, the key waits for reconciliation",
			slog.String("key_hash", keyHash(req)), slog.Any("error", err))
	}
}
