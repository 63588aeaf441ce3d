package idem

import (
	"context"
	"errors"
	"time"

	"github.com/idemguard/idem/durable"
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
	// The execution is made before the claim: it holds the claim's context
	// too, so that a first execution allocates once for both.
	x := &execution{g: g, req: req, owner: newToken()}
	t0 := time.Now()
	x.claimBound.start(ctx, t0.Add(g.storeTimeout))
	rec, claimed, err := g.store.Claim(&x.claimBound, durable.ClaimParams{
		Scope: req.Scope, Key: req.Key, Fingerprint: req.Fingerprint, Owner: x.owner,
	})
	now := time.Now()
	x.claimBound.endAt(now)
	g.tel.since(ctx, phaseClaim, t0)
	if err != nil {
		return g.storeFailed(ctx, req, "claim", err)
	}
	if !claimed {
		resp, out, err := g.decide(ctx, req, rec, t0)
		if lease != nil {
			g.leaseFromRow(ctx, req, lease, rec, errors.Is(err, ErrPending), t0)
		}
		return resp, out, err
	}
	x.expires, x.claimed = t0.Add(rec.TTL), now
	return x.run(ctx, work)
}
