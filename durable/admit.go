package durable

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// admitting runs the statements that admit a request (Claim and Get) on a
// connection of pool that it waits for at most wait: when PostgreSQL is slow
// and every connection is busy, a new request is refused at once instead of
// queueing for its whole timeout behind requests that will time out too, so
// that the queue, and the time to recover once PostgreSQL is fast again, stay
// short. Statements that finish an execution (the answer, a release) use the
// pool directly and wait as long as their context allows.
type admitting struct {
	pool *pgxpool.Pool
	wait time.Duration
}

// errNoConnection is the cause reported when no connection was free in time.
var errNoConnection = errors.New("no connection of the pool was free in time")

func (a admitting) acquire(ctx context.Context) (*pgxpool.Conn, error) {
	actx, cancel := context.WithTimeout(ctx, a.wait)
	defer cancel()
	c, err := a.pool.Acquire(actx)
	if err != nil && ctx.Err() == nil && actx.Err() != nil {
		return nil, fmt.Errorf("%w (waited %v, %d connections in use)", errNoConnection, a.wait, a.pool.Stat().AcquiredConns())
	}
	return c, err
}

func (a admitting) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c, err := a.acquire(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer c.Release()
	return c.Exec(ctx, sql, args...)
}

func (a admitting) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c, err := a.acquire(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := c.Query(ctx, sql, args...)
	if err != nil {
		c.Release()
		return nil, err
	}
	return &releasingRows{Rows: rows, conn: c}, nil
}

func (a admitting) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c, err := a.acquire(ctx)
	if err != nil {
		return errRow{err}
	}
	return &releasingRow{row: c.QueryRow(ctx, sql, args...), conn: c}
}

// releasingRow gives its connection back once scanned.
type releasingRow struct {
	row  pgx.Row
	conn *pgxpool.Conn
}

func (r *releasingRow) Scan(dest ...any) error {
	defer r.conn.Release()
	return r.row.Scan(dest...)
}

// releasingRows gives its connection back once closed.
type releasingRows struct {
	pgx.Rows
	conn *pgxpool.Conn
	done bool
}

func (r *releasingRows) Close() {
	r.Rows.Close()
	if !r.done {
		r.done = true
		r.conn.Release()
	}
}

func (r *releasingRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
