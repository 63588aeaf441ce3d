package advisory_test

import (
	"context"
	"crypto/rand"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/internal/advisory"
	"github.com/idemguard/idem/internal/testdb"
)

// uniqueKey returns a lock key no other test uses.
func uniqueKey(t *testing.T) int64 {
	return advisory.Key("idemtest:" + t.Name() + ":" + rand.Text())
}

// held reports whether any session holds the advisory lock key.
func held(t *testing.T, pool *pgxpool.Pool, key int64) bool {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), `
SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND granted
	AND ((classid::bigint << 32) | objid::bigint) = $1`, key).Scan(&n))
	return n > 0
}

func TestKey(t *testing.T) {
	t.Parallel()
	require.Equal(t, advisory.Key("idem:sweep:a"), advisory.Key("idem:sweep:a"))
	require.NotEqual(t, advisory.Key("idem:sweep:a"), advisory.Key("idem:sweep:b"))
	require.NotEqual(t, advisory.Key("idem:sweep:a"), advisory.Key("idem:reconcile:a"))
}

func TestOneHolderAtATime(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	key := uniqueKey(t)
	ctx := t.Context()

	inside := make(chan struct{})
	leave := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		ran, err := advisory.Do(ctx, pool, key, func(ctx context.Context, conn *pgxpool.Conn) error {
			close(inside)
			<-leave
			return nil
		})
		if err == nil && !ran {
			err = errors.New("first holder did not run")
		}
		first <- err
	}()
	<-inside
	require.True(t, held(t, pool, key))

	// A second holder, while the first runs: skipped, fn not called.
	ran, err := advisory.Do(ctx, pool, key, func(context.Context, *pgxpool.Conn) error {
		t.Error("second holder ran")
		return nil
	})
	require.NoError(t, err)
	require.False(t, ran)

	close(leave)
	require.NoError(t, <-first)
	require.False(t, held(t, pool, key), "released after the job")

	// Free again: the next one runs.
	ran, err = advisory.Do(ctx, pool, key, func(context.Context, *pgxpool.Conn) error { return nil })
	require.NoError(t, err)
	require.True(t, ran)
}

func TestConcurrentHolders(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	key := uniqueKey(t)
	const n = 8
	start := make(chan struct{})
	release := make(chan struct{})
	results := make(chan bool, n)
	for range n {
		go func() {
			<-start
			ran, err := advisory.Do(t.Context(), pool, key, func(context.Context, *pgxpool.Conn) error {
				<-release // hold until every other caller has given up
				return nil
			})
			if err != nil {
				t.Error(err)
			}
			results <- ran
		}()
	}
	close(start)
	ranCount := 0
	for range n - 1 {
		if <-results {
			ranCount++
		}
	}
	close(release)
	if <-results {
		ranCount++
	}
	require.Equal(t, 1, ranCount)
}

func TestErrorPanicAndCancel(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	key := uniqueKey(t)

	t.Run("fn error is returned, lock released", func(t *testing.T) {
		boom := errors.New("boom")
		ran, err := advisory.Do(t.Context(), pool, key, func(context.Context, *pgxpool.Conn) error { return boom })
		require.True(t, ran)
		require.ErrorIs(t, err, boom)
		require.False(t, held(t, pool, key))
	})

	t.Run("panic releases the lock", func(t *testing.T) {
		require.PanicsWithValue(t, "boom", func() {
			_, _ = advisory.Do(t.Context(), pool, key, func(context.Context, *pgxpool.Conn) error { panic("boom") })
		})
		require.False(t, held(t, pool, key))
	})

	t.Run("cancelled during fn: still unlocked", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		ran, err := advisory.Do(ctx, pool, key, func(ctx context.Context, conn *pgxpool.Conn) error {
			cancel()
			return ctx.Err()
		})
		require.True(t, ran)
		require.ErrorIs(t, err, context.Canceled)
		require.False(t, held(t, pool, key))
	})

	t.Run("cancelled before", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		ran, err := advisory.Do(ctx, pool, key, func(context.Context, *pgxpool.Conn) error {
			t.Error("ran")
			return nil
		})
		require.False(t, ran)
		require.ErrorIs(t, err, context.Canceled)
	})

	t.Run("statement on the lock's connection", func(t *testing.T) {
		ran, err := advisory.Do(t.Context(), pool, key, func(ctx context.Context, conn *pgxpool.Conn) error {
			var one int
			return conn.QueryRow(ctx, "SELECT 1").Scan(&one)
		})
		require.True(t, ran)
		require.NoError(t, err)
	})
}
