package main

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/internal/testdb"
)

// newTestPayrail returns a Payrail with that latency on a schema of its own,
// and the pool and schema it uses. Without PostgreSQL the test is skipped, or
// fails under CI=true.
func newTestPayrail(t *testing.T, latency time.Duration) (*Payrail, *pgxpool.Pool, string) {
	t.Helper()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t, pool)
	p, err := NewPayrail(t.Context(), pool, schema, latency)
	require.NoError(t, err)
	return p, pool, schema
}

// requireCounts checks the charges performed and the attempts received.
func requireCounts(t *testing.T, p *Payrail, count, attempts int) {
	t.Helper()
	n, err := p.Count(t.Context())
	require.NoError(t, err)
	require.Equal(t, count, n, "count")
	n, err = p.Attempts(t.Context())
	require.NoError(t, err)
	require.Equal(t, attempts, n, "attempts")
}

func TestPayrail(t *testing.T) {
	t.Parallel()
	visa := ChargeRequest{Amount: 9000, Currency: "EUR", PaymentMethod: "pm_card_visa"}

	t.Run("idempotent on its key", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		p, _, _ := newTestPayrail(t, 0)
		requireCounts(t, p, 0, 0)
		first, err := p.Charge(ctx, "order-1", visa)
		require.NoError(t, err)
		require.Equal(t, ChargeSucceeded, first.Status)
		require.True(t, strings.HasPrefix(first.ID, "ch_"), first.ID)
		require.Equal(t, Charge{
			ID: first.ID, Key: "order-1", Amount: 9000, Currency: "EUR", PaymentMethod: "pm_card_visa",
			Status: ChargeSucceeded, CreatedAt: first.CreatedAt,
		}, first)
		require.WithinDuration(t, time.Now(), first.CreatedAt, time.Minute)
		requireCounts(t, p, 1, 1)

		again, err := p.Charge(ctx, "order-1", visa)
		require.NoError(t, err)
		require.Equal(t, first, again)
		requireCounts(t, p, 1, 2) // replayed: no charge, one more attempt

		second, err := p.Charge(ctx, "order-2", visa)
		require.NoError(t, err)
		require.NotEqual(t, first.ID, second.ID)
		requireCounts(t, p, 2, 3)

		got, ok, err := p.Lookup(ctx, "order-1")
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, first, got)
		_, ok, err = p.Lookup(ctx, "order-3")
		require.NoError(t, err)
		require.False(t, ok)
	})

	t.Run("key reused with other parameters", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		p, _, _ := newTestPayrail(t, 0)
		first, err := p.Charge(ctx, "order-1", visa)
		require.NoError(t, err)
		for _, other := range []ChargeRequest{
			{Amount: visa.Amount + 1, Currency: visa.Currency, PaymentMethod: visa.PaymentMethod},
			{Amount: visa.Amount, Currency: "USD", PaymentMethod: visa.PaymentMethod},
			{Amount: visa.Amount, Currency: visa.Currency, PaymentMethod: PMDeclined},
		} {
			_, err = p.Charge(ctx, "order-1", other)
			require.ErrorIs(t, err, ErrKeyReused, "%+v", other)
		}
		requireCounts(t, p, 1, 4) // refusals are attempts too
		got, ok, err := p.Lookup(ctx, "order-1")
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, first, got)
	})

	t.Run("declined", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		p, _, _ := newTestPayrail(t, 0)
		req := ChargeRequest{Amount: 9000, Currency: "EUR", PaymentMethod: PMDeclined}
		for range 2 {
			_, err := p.Charge(ctx, "order-1", req)
			require.ErrorIs(t, err, ErrDeclined)
		}
		requireCounts(t, p, 0, 2)
		c, ok, err := p.Lookup(ctx, "order-1")
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, ChargeDeclined, c.Status)
		require.Equal(t, PMDeclined, c.PaymentMethod)
	})

	t.Run("timeout charges, lookup finds it", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		p, _, _ := newTestPayrail(t, 0)
		req := ChargeRequest{Amount: 9000, Currency: "EUR", PaymentMethod: PMTimeout}
		_, err := p.Charge(ctx, "order-1", req)
		require.ErrorIs(t, err, ErrTimeout)
		requireCounts(t, p, 1, 1)
		c, ok, err := p.Lookup(ctx, "order-1")
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, ChargeSucceeded, c.Status)

		// The same key again gets the charge that was made.
		again, err := p.Charge(ctx, "order-1", req)
		require.NoError(t, err)
		require.Equal(t, c, again)
		requireCounts(t, p, 1, 2)
	})

	t.Run("cancelled before the provider acts", func(t *testing.T) {
		t.Parallel()
		p, _, _ := newTestPayrail(t, time.Hour)
		cctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
		defer cancel()
		_, err := p.Charge(cctx, "order-1", visa)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		requireCounts(t, p, 0, 0)
		_, ok, err := p.Lookup(t.Context(), "order-1")
		require.NoError(t, err)
		require.False(t, ok)
	})

	t.Run("empty key", func(t *testing.T) {
		t.Parallel()
		p, _, _ := newTestPayrail(t, 0)
		_, err := p.Charge(t.Context(), "", visa)
		require.ErrorContains(t, err, "empty idempotency key")
		requireCounts(t, p, 0, 0)
	})

	t.Run("database errors are errors, not answers", func(t *testing.T) {
		t.Parallel()
		_, _, schema := newTestPayrail(t, 0)
		pool := testdb.Pool(t)
		p, err := NewPayrail(t.Context(), pool, schema, 0)
		require.NoError(t, err)
		pool.Close() // the provider is unreachable
		_, err = p.Charge(t.Context(), "order-1", visa)
		require.Error(t, err)
		require.NotErrorIs(t, err, ErrDeclined)
		_, ok, err := p.Lookup(t.Context(), "order-1")
		require.Error(t, err)
		require.False(t, ok)
		_, err = p.Count(t.Context())
		require.Error(t, err)
		_, err = p.Attempts(t.Context())
		require.Error(t, err)
	})

	t.Run("state outlives the process and is shared", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		// Two processes: two pools over one database and schema, starting
		// together (both create the tables).
		schema := testdb.Schema(t, testdb.Pool(t))
		pool1, pool2 := testdb.Pool(t), testdb.Pool(t)
		var p1, p2 *Payrail
		var err1, err2 error
		var wg sync.WaitGroup
		wg.Go(func() { p1, err1 = NewPayrail(ctx, pool1, schema, 0) })
		wg.Go(func() { p2, err2 = NewPayrail(ctx, pool2, schema, 0) })
		wg.Wait()
		require.NoError(t, err1)
		require.NoError(t, err2)

		first, err := p1.Charge(ctx, "order-1", visa)
		require.NoError(t, err)
		again, err := p2.Charge(ctx, "order-1", visa)
		require.NoError(t, err)
		require.Equal(t, first, again)
		_, err = p2.Charge(ctx, "order-2", ChargeRequest{Amount: 1, Currency: "EUR", PaymentMethod: PMTimeout})
		require.ErrorIs(t, err, ErrTimeout)
		requireCounts(t, p1, 2, 3)
		requireCounts(t, p2, 2, 3)

		// The first process dies; a new one finds what it did.
		pool1.Close()
		pool3 := testdb.Pool(t)
		p3, err := NewPayrail(ctx, pool3, schema, 0)
		require.NoError(t, err)
		got, ok, err := p3.Lookup(ctx, "order-1")
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, first, got)
		got, ok, err = p3.Lookup(ctx, "order-2")
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, ChargeSucceeded, got.Status)
		requireCounts(t, p3, 2, 3)
	})

	t.Run("concurrent calls with one key charge once", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		p1, _, schema := newTestPayrail(t, time.Millisecond)
		p2, err := NewPayrail(ctx, testdb.Pool(t), schema, time.Millisecond) // another process
		require.NoError(t, err)
		const n = 32
		var wg sync.WaitGroup
		ids := make([]string, n)
		errs := make([]error, n)
		start := make(chan struct{})
		for i := range n {
			p := p1
			if i%2 == 1 {
				p = p2
			}
			wg.Go(func() {
				<-start
				c, err := p.Charge(ctx, "order-1", visa)
				ids[i], errs[i] = c.ID, err
			})
		}
		close(start)
		wg.Wait()
		for i := range n {
			require.NoError(t, errs[i])
			require.Equal(t, ids[0], ids[i])
		}
		require.NotEmpty(t, ids[0])
		requireCounts(t, p1, 1, n)
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
