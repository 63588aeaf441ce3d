package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/internal/testdb"
)

// TestResolverMovesAnOrderOnlyFromWhatItRead: the resolver may run twice at
// once across a fleet, or late (a reconciler paused past its lease), so its
// writes are compare-and-sets. A late run that found no charge does not mark
// abandoned the order the intent's next attempt has paid since; a second run
// that found the same charge finds the order where it would put it.
func TestResolverMovesAnOrderOnlyFromWhatItRead(t *testing.T) {
	ctx := t.Context()
	pool := testdb.Pool(t)
	orders, err := newOrderStore(ctx, pool, testdb.Schema(t, pool))
	require.NoError(t, err)
	o, err := orders.create(ctx, Order{ID: "ord_1", Status: OrderPaymentUnknown, HoldIDs: []int64{1},
		owner: "user-1", idempotencyKey: "key-1", paymentMethod: PMTimeout, amount: pricePerHold})
	require.NoError(t, err)
	read := o.Status

	// Another run abandoned the order, and the next attempt paid it.
	paid := o
	paid.Status, paid.ChargeID = OrderPaid, "ch_1"
	require.NoError(t, orders.update(ctx, pool, paid))

	late := o
	late.Status = OrderAbandoned
	require.ErrorIs(t, orders.transition(ctx, late, read), errOrderMoved)
	got, found, err := orders.get(ctx, o.ID)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, OrderPaid, got.Status, "the paid order stays paid")
	require.Equal(t, "ch_1", got.ChargeID)

	require.NoError(t, orders.transition(ctx, paid, read), "a second run that found the same charge")
}
