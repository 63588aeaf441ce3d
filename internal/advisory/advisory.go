// Package advisory runs a job on one instance at a time across a fleet,
// under a PostgreSQL session-level advisory lock.
//
// The lock is held by a dedicated connection taken from a pool for the whole
// job, so it is released by the server if the process dies (the session
// ends) and never outlives its holder. An instance that does not get the lock
// skips the job for this round; nobody waits.
package advisory

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Acquirer hands out a dedicated connection. *pgxpool.Pool satisfies it.
type Acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// unlockTimeout bounds pg_advisory_unlock, which runs even when the job's
// context has ended.
const unlockTimeout = 5 * time.Second

// Key derives a 64-bit advisory lock key from a name, such as
// "idem:sweep:"+table: the FNV-1a hash of the name. Equal names give equal
// keys in every process.
func Key(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return int64(h.Sum64())
}

// Do runs fn while holding the session-level advisory lock key, on a
// connection acquired from pool and passed to fn (fn may run its statements
// on it, or on other connections).
//
// It reports ran == false, with a nil error, when another session holds the
// lock: fn did not run and the caller skips this round. Otherwise it returns
// fn's error, joined with any error of releasing the lock.
//
// The lock is released with pg_advisory_unlock under a context that survives
// the cancellation of ctx (5s timeout), also when fn panics. If the unlock
// fails, the connection is closed rather than returned to the pool, so that
// the lock dies with the session instead of staying held by a pooled
// connection.
func Do(ctx context.Context, pool Acquirer, key int64, fn func(ctx context.Context, conn *pgxpool.Conn) error) (ran bool, err error) {
	if pool == nil {
		return false, errors.New("advisory: nil pool")
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("advisory: acquire connection: %w", err)
	}
	var locked bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&locked); err != nil {
		discard(ctx, conn)
		return false, fmt.Errorf("advisory: try lock: %w", err)
	}
	if !locked {
		conn.Release()
		return false, nil
	}
	defer func() {
		if uerr := unlock(ctx, conn, key); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}()
	return true, fn(ctx, conn)
}

// unlock releases the lock and the connection.
func unlock(ctx context.Context, conn *pgxpool.Conn, key int64) error {
	if conn.Conn().IsClosed() {
		// The session has ended, and its locks with it.
		conn.Release()
		return nil
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
	defer cancel()
	var unlocked bool
	err := conn.QueryRow(uctx, "SELECT pg_advisory_unlock($1)", key).Scan(&unlocked)
	if err == nil && !unlocked {
		err = errors.New("lock was not held")
	}
	if err != nil {
		discard(uctx, conn)
		return fmt.Errorf("advisory: unlock: %w", err)
	}
	conn.Release()
	return nil
}

// discard closes the connection, ending its session and any lock it holds,
// and gives it back to the pool, which destroys a closed connection.
func discard(ctx context.Context, conn *pgxpool.Conn) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
	defer cancel()
	_ = conn.Conn().Close(cctx)
	conn.Release()
}
