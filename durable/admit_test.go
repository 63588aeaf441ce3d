package durable_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
)

// With every connection of the pool busy, a claim (a new request) is refused
// as soon as AdmissionWait has passed, long before its own deadline, while an
// answer write waits for a connection as long as its context allows.
func TestAdmissionFailsFastWhenThePoolIsBusy(t *testing.T) {
	b := setup(t, &durable.Config{AdmissionWait: 50 * time.Millisecond})
	p := params(t, "user-1", "key-1", "a")
	owner := b.claim(t, p).Owner

	var held []*pgxpool.Conn
	for range b.pool.Config().MaxConns {
		c, err := b.pool.Acquire(b.ctx)
		require.NoError(t, err)
		held = append(held, c)
	}
	release := func() {
		for _, c := range held {
			c.Release()
		}
		held = nil
	}
	t.Cleanup(release)

	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	_, _, err := b.store.Claim(ctx, params(t, "user-1", "key-2", "a"))
	require.Error(t, err)
	require.NoError(t, ctx.Err(), "refused before the caller's deadline")
	require.Contains(t, err.Error(), "no connection of the pool was free")
	_, err = b.store.Get(ctx, "user-1", "key-1")
	require.Error(t, err)
	require.NoError(t, ctx.Err())

	// The answer of a request that ran waits for its connection.
	wctx, wcancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer wcancel()
	done := make(chan error, 1)
	go func() { done <- b.store.Complete(wctx, p.Scope, p.Key, owner, idem.Response{Status: 201}) }()
	select {
	case err := <-done:
		t.Fatalf("the answer write gave up before its deadline: %v", err)
	case <-time.After(4 * 50 * time.Millisecond): // four times AdmissionWait
	}
	release()
	require.NoError(t, <-done, "stored once a connection was free")

	_, claimed, err := b.store.Claim(ctx, params(t, "user-1", "key-2", "a"))
	require.NoError(t, err)
	require.True(t, claimed)
}
