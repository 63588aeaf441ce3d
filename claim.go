package idem

import (
	"context"
	"time"

	"github.com/idemguard/idem/durable"
)

// claimAndRun is the table strategy, and the fence under every hybrid lease:
// the durable claim (INSERT ... ON CONFLICT DO NOTHING) decides who runs.
// The winner runs the work and writes its answer under its owner token; a
// loser is answered from the row it found (422, 409 or a replay).
//
// release gives back the hybrid's lease; nil in table mode, after a
// fallback, or on the read path.
func (g *Guard) claimAndRun(ctx context.Context, req Request, work Work, release func(context.Context) error) (Response, Outcome, error) {
	// The execution is made before the claim: it holds the claim's context
	// too, so that a first execution allocates once for both.
	x := &execution{g: g, req: req, owner: newToken(), lease: release}
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
		return g.decide(ctx, req, rec)
	}
	x.createdAt, x.claimed = rec.CreatedAt, now
	return x.run(ctx, work)
}
