package main

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPayrail(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	visa := ChargeRequest{Amount: 9000, Currency: "EUR", PaymentMethod: "pm_card_visa"}

	t.Run("idempotent on its key", func(t *testing.T) {
		p := NewPayrail(0)
		first, err := p.Charge(ctx, "order-1", visa)
		require.NoError(t, err)
		require.Equal(t, ChargeSucceeded, first.Status)
		again, err := p.Charge(ctx, "order-1", visa)
		require.NoError(t, err)
		require.Equal(t, first, again)
		require.Equal(t, 1, p.Count())

		_, err = p.Charge(ctx, "order-2", visa)
		require.NoError(t, err)
		require.Equal(t, 2, p.Count())

		got, ok := p.Lookup("order-1")
		require.True(t, ok)
		require.Equal(t, first, got)
		_, ok = p.Lookup("order-3")
		require.False(t, ok)
	})

	t.Run("key reused with other parameters", func(t *testing.T) {
		p := NewPayrail(0)
		_, err := p.Charge(ctx, "order-1", visa)
		require.NoError(t, err)
		other := visa
		other.Amount++
		_, err = p.Charge(ctx, "order-1", other)
		require.ErrorIs(t, err, ErrKeyReused)
		require.Equal(t, 1, p.Count())
	})

	t.Run("declined", func(t *testing.T) {
		p := NewPayrail(0)
		req := ChargeRequest{Amount: 9000, Currency: "EUR", PaymentMethod: PMDeclined}
		for range 2 {
			_, err := p.Charge(ctx, "order-1", req)
			require.ErrorIs(t, err, ErrDeclined)
		}
		require.Equal(t, 0, p.Count())
		c, ok := p.Lookup("order-1")
		require.True(t, ok)
		require.Equal(t, ChargeDeclined, c.Status)
	})

	t.Run("timeout charges, lookup finds it", func(t *testing.T) {
		p := NewPayrail(0)
		req := ChargeRequest{Amount: 9000, Currency: "EUR", PaymentMethod: PMTimeout}
		_, err := p.Charge(ctx, "order-1", req)
		require.ErrorIs(t, err, ErrTimeout)
		require.Equal(t, 1, p.Count())
		c, ok := p.Lookup("order-1")
		require.True(t, ok)
		require.Equal(t, ChargeSucceeded, c.Status)

		// The same key again gets the charge that was made.
		again, err := p.Charge(ctx, "order-1", req)
		require.NoError(t, err)
		require.Equal(t, c, again)
		require.Equal(t, 1, p.Count())
	})

	t.Run("cancelled before the provider acts", func(t *testing.T) {
		p := NewPayrail(time.Hour)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		defer cancel()
		_, err := p.Charge(cctx, "order-1", visa)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Equal(t, 0, p.Count())
		_, ok := p.Lookup("order-1")
		require.False(t, ok)
	})

	t.Run("concurrent calls with one key charge once", func(t *testing.T) {
		p := NewPayrail(time.Millisecond)
		var wg sync.WaitGroup
		ids := make([]string, 32)
		for i := range ids {
			wg.Go(func() {
				c, err := p.Charge(ctx, "order-1", visa)
				if err == nil {
					ids[i] = c.ID
				}
			})
		}
		wg.Wait()
		for _, id := range ids {
			require.Equal(t, ids[0], id)
		}
		require.NotEmpty(t, ids[0])
		require.Equal(t, 1, p.Count())
	})
}

func TestDecodeOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body, detail string
	}{
		{`{"hold_ids": [88211, 88212], "payment_method": "pm_card_visa"}`, ""},
		{``, "JSON object"},
		{`[]`, "JSON object"},
		{`{"hold_ids": [1], "payment_method": "pm_x"} {}`, "JSON object"},
		{`{"hold_ids": [1], "payment_method": "pm_x", "x": 1}`, "JSON object"},
		{`{"hold_ids": [], "payment_method": "pm_x"}`, "at least one hold"},
		{`{"payment_method": "pm_x"}`, "at least one hold"},
		{`{"hold_ids": [1]}`, "payment_method is required"},
		{`{"hold_ids": [1], "payment_method": "card"}`, `starting with "pm_"`},
		{`{"hold_ids": [0], "payment_method": "pm_x"}`, "positive"},
		{`{"hold_ids": [1, 1], "payment_method": "pm_x"}`, "repeat"},
	} {
		_, detail := decodeOrder(strings.NewReader(tc.body))
		if tc.detail == "" {
			require.Empty(t, detail, tc.body)
		} else {
			require.Contains(t, detail, tc.detail, tc.body)
		}
	}
}
