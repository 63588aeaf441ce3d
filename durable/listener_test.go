package durable_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
)

// woken waits up to 5s for a wake-up; it fails the test otherwise.
func woken(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("not woken: %s", what)
	}
}

// quietFor checks that ch is not woken within d (a wake-up that does come
// is a failure; one that would come later cannot be seen, so this never
// fails spuriously).
func quietFor(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("woken: %s", what)
	case <-time.After(d):
	}
}

// channelOf is the table's channel, as the store names it: "idem_" and 16
// hex digits of the SHA-256 of the quoted, qualified table name.
func channelOf(table string) string {
	sum := sha256.Sum256([]byte(table))
	return "idem_" + hex.EncodeToString(sum[:8])
}

// newListener starts a Listener; it listens when NewListener returns.
func newListener(t *testing.T, b *bundle) *durable.Listener {
	t.Helper()
	l, err := durable.NewListener(b.ctx, b.store)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.Close()) })
	return l
}

// A store with Notify announces every key it completes or releases, at
// commit; a Listener wakes that key's subscribers, and only them.
func TestListenerWakesSubscribersOfTheKey(t *testing.T) {
	b := setup(t, &durable.Config{Notify: true})
	l := newListener(t, b)
	p := params(t, "user-1", "key-1", "a")
	wake, cancel := l.Subscribe(p.Scope, p.Key)
	defer cancel()
	other, cancelOther := l.Subscribe(p.Scope, "key-2")
	defer cancelOther()

	b.claim(t, p)
	require.NoError(t, b.store.Complete(b.ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 201}))
	woken(t, wake, "complete")
	quietFor(t, other, 200*time.Millisecond, "another key")

	q := params(t, "user-1", "key-3", "a")
	wq, cq := l.Subscribe(q.Scope, q.Key)
	defer cq()
	b.claim(t, q)
	require.NoError(t, b.store.Release(b.ctx, q.Scope, q.Key, q.Owner))
	woken(t, wq, "release")

	// A failed write announces nothing.
	require.ErrorIs(t, b.store.Release(b.ctx, q.Scope, q.Key, q.Owner), idem.ErrNotFound)
	quietFor(t, wq, 200*time.Millisecond, "a release that deleted nothing")
}

// In a caller's transaction the announcement goes out at commit, never on
// rollback.
func TestListenerAnnouncesAtCommit(t *testing.T) {
	b := setup(t, &durable.Config{Notify: true})
	l := newListener(t, b)
	for _, commit := range []bool{false, true} {
		p := params(t, "user-1", "key-"+map[bool]string{false: "rb", true: "c"}[commit], "a")
		wake, cancel := l.Subscribe(p.Scope, p.Key)
		b.claim(t, p)
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			require.NoError(t, b.store.WithDB(tx).Complete(b.ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 201}))
			quietFor(t, wake, 200*time.Millisecond, "before commit")
			if !commit {
				return context.Canceled // roll back
			}
			return nil
		})
		if commit {
			require.NoError(t, err)
		} else {
			require.ErrorIs(t, err, context.Canceled)
		}
		if commit {
			woken(t, wake, "at commit")
		} else {
			quietFor(t, wake, 200*time.Millisecond, "a rolled-back answer")
		}
		cancel()
	}
}

// Without Config.Notify nothing is announced.
func TestListenerNeedsNotify(t *testing.T) {
	b := setup(t, nil)
	l := newListener(t, b)
	p := params(t, "user-1", "key-1", "a")
	wake, cancel := l.Subscribe(p.Scope, p.Key)
	defer cancel()
	b.claim(t, p)
	require.NoError(t, b.store.Complete(b.ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 201}))
	quietFor(t, wake, 300*time.Millisecond, "a store without Notify")
}

// The listening connection is killed: every subscriber is woken (it may have
// missed an announcement), the Listener reconnects, and announcements reach
// subscribers again. Close wakes everyone, and later subscribers at once.
func TestListenerReconnects(t *testing.T) {
	if _, err := durable.NewListener(t.Context(), nil); err == nil {
		t.Fatal("NewListener without a store must fail")
	}
	b := setup(t, &durable.Config{Notify: true})
	l := newListener(t, b)
	p := params(t, "user-1", "key-1", "a")
	wake, cancel := l.Subscribe(p.Scope, p.Key)
	defer cancel()

	var killed int
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE query LIKE 'LISTEN %' AND datname = current_database() AND pid <> pg_backend_pid()
	AND query = 'LISTEN "' || $1 || '"'`, channelOf(b.store.Table())).Scan(&killed))
	require.Equal(t, 1, killed)
	woken(t, wake, "the connection was lost")
	// Once it listens again it wakes everyone once more (announcements
	// made meanwhile were missed): a second wake-up.
	woken(t, wake, "listening again")

	b.claim(t, p)
	require.NoError(t, b.store.Complete(b.ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 201}))
	woken(t, wake, "complete after the reconnect")

	require.NoError(t, l.Close())
	woken(t, wake, "close")
	late, cancelLate := l.Subscribe(p.Scope, "key-9")
	defer cancelLate()
	woken(t, late, "subscribed after close")
}
