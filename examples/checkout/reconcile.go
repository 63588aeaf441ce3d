package main

import (
	"context"

	"github.com/idemguard/idem/reconcile"
)

// resolve is the reconciler's question to the world: what really happened to
// the request that left this key in progress? The row names the intent
// (Item.Intent), the intent names the order (orderID), and the order names its
// charge at the provider (order-{public_id}), so the answer is one lookup
// away. The provider keeps its charges whatever happens to this service, so a
// request killed mid-charge is found too.
//
//   - no order: the order row is written before any charge, so nothing was
//     charged; the key is released and the client's next retry runs.
//   - an order, but no charge under its key: the request died before the
//     charge; the order is marked abandoned and the key released likewise.
//     The retry is the next attempt of the same intent: it takes up the same
//     order and charges it under the same provider key.
//     WARNING: this trusts that a charge call of the dead request cannot
//     still reach the provider after MinAge (-reconcile-after); a real
//     provider's request timeout must be shorter than that.
//   - a charge: the order's final state is recorded and the key is settled
//     with the answer the request would have given, which the next retry
//     gets (201, or 402 for a decline).
//
// Across a fleet this may run twice at once for one key, or late: a
// reconciler paused past its lease resumes and runs on, and only its
// decision is dropped (see reconcile.ResolveFunc). So the order is moved
// only from the status read here (orderStore.transition, a compare-and-set):
// a late run that found no charge cannot mark abandoned the order that the
// intent's next attempt has paid since; it fails, and the key, if still in
// progress, is looked at again later. The provider lookup is a read.
func (c *checkout) resolve(ctx context.Context, it reconcile.Item) (reconcile.Decision, error) {
	o, found, err := c.orders.get(ctx, orderID(it.Intent))
	if err != nil {
		return reconcile.Decision{}, err // unknown: tried again later
	}
	if !found {
		return reconcile.Decision{Verdict: reconcile.NothingHappened}, nil
	}
	from := o.Status
	ch, charged, err := c.payrail.Lookup(ctx, o.paymentKey())
	if err != nil {
		return reconcile.Decision{}, err // unknown: tried again later
	}
	if !charged {
		o.Status = OrderAbandoned
		if err := c.orders.transition(ctx, o, from); err != nil {
			return reconcile.Decision{}, err
		}
		return reconcile.Decision{Verdict: reconcile.NothingHappened}, nil
	}
	resp := declinedResponse()
	if ch.Status == ChargeDeclined {
		o.Status = OrderDeclined
	} else {
		o.Status, o.ChargeID = OrderPaid, ch.ID
		resp = createdResponse(o)
	}
	if err := c.orders.transition(ctx, o, from); err != nil {
		return reconcile.Decision{}, err
	}
	return reconcile.Decision{Verdict: reconcile.Settled, Response: resp}, nil
}
