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
	x := &execution{g: g, req: req, owner: owner, createdAt: rec.CreatedAt, claimed: time.Now(), lease: release}
	return x.run(ctx, work)
}
