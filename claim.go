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
	p := ClaimParams{
		// No Intent: a new key's intent is its first owner token, which
		// keeps the row as narrow as before (the store writes no intent
		// then); every later attempt gets an owner token of its own and
		// keeps the intent.
		Scope: req.Scope, Key: req.Key, Fingerprint: req.Fingerprint, Owner: owner,
		Hold: g.MaxHold(),
	}
	rec, claimed, err := g.store.Claim(cctx, p)
	cancel()
	g.tel.since(ctx, phaseClaim, t0)
	if err != nil {
		if ambiguous(err) {
			g.giveBack(ctx, req, p, t0)
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
	g.traces.attempt(ctx, rec.Attempt)
	return x.run(ctx, work)
}

// ambiguous reports whether a failed claim may have committed all the same:
// its reply did not come back in time (StoreTimeout, a stalled synchronous
// standby) or the caller gave up while it was out. An error the store
// returned, or a refused connection, says nothing was written.
func ambiguous(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// giveBackTimeout bounds each attempt to release a claim that may have
// committed.
const giveBackTimeout = time.Second

// giveBacker is a store that can give back a claim whose reply was lost
// without racing the claim's own commit: *durable.Store's GiveBack waits for
// a claim of the key in flight, and writes a released row when there is
// none, so that once it succeeds the claim can no longer hold the key.
type giveBacker interface {
	GiveBack(ctx context.Context, p ClaimParams) error
}

// giveBack releases, owner-checked, a claim that may have committed although
// the claim call failed, so that the key is not left in progress with no
// execution behind it until a reconciler finds it: the work never ran, so
// nothing happened. A store that can tell (giveBacker) is asked until it
// does, with growing pauses, for as long as the claim could have held the
// key (MaxHold from the claim, t0): the request that made the claim waits
// for it, as it would have for its work, so that its 503 comes only once
// the key is free again (during a stalled synchronous standby, once the
// standby answers). Past MaxHold the key is pending and the reconciler's.
// Other stores get one owner-checked Release, which finds nothing when the
// claim has not committed yet.
func (g *Guard) giveBack(ctx context.Context, req Request, p ClaimParams, t0 time.Time) {
	gb, ok := g.store.(giveBacker)
	if !ok {
		g.reportGiveBack(ctx, req, g.releaseOnce(ctx, p))
		return
	}
	deadline := t0.Add(g.MaxHold())
	var err error
	for pause := 100 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(g.storeTimeout, giveBackTimeout))
		err = gb.GiveBack(rctx, p)
		cancel()
		if err == nil || settled(err) || time.Now().Add(pause).After(deadline) {
			break
		}
		time.Sleep(pause) // after a failed attempt: nothing to wait for but time
	}
	g.reportGiveBack(ctx, req, err)
}

// releaseOnce is the give-back of a store without GiveBack.
func (g *Guard) releaseOnce(ctx context.Context, p ClaimParams) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(g.storeTimeout, giveBackTimeout))
	defer cancel()
	return g.store.Release(rctx, p.Scope, p.Key, p.Owner)
}

// settled reports whether a give-back's error says there is nothing (more)
// to give back: another claim holds the key, it is answered, or released.
func settled(err error) bool {
	return errors.Is(err, ErrNotFound) || errors.Is(err, ErrNotOwner) || errors.Is(err, ErrCompleted)
}

func (g *Guard) reportGiveBack(ctx context.Context, req Request, err error) {
	switch {
	case err == nil:
		g.tel.add(ctx, evReleased)
		g.log.LogAttrs(ctx, slog.LevelWarn, "idem: gave back a claim whose reply was lost; the work did not run",
			slog.String("key_hash", keyHash(req)))
	case settled(err):
		// The claim did not commit, or another holds the key: nothing to give back.
	default:
		g.log.LogAttrs(ctx, slog.LevelWarn, "idem: could not give back a claim whose reply was lost; if it committed, the key waits for reconciliation",
			slog.String("key_hash", keyHash(req)), slog.Any("error", err))
	}
}
