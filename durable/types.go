package durable

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is the narrow interface the Store runs its statements through. Both
// *pgxpool.Pool and pgx.Tx (and *pgx.Conn) satisfy it, so a caller can run the
// store inside its own transaction with [Store.WithDB].
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Beginner is a DB that can start a transaction. [Migrate] needs one so that
// it can hold a transaction-scoped advisory lock. *pgxpool.Pool, *pgx.Conn
// and pgx.Tx (as a savepoint) satisfy it.
type Beginner interface {
	DB
	Begin(ctx context.Context) (pgx.Tx, error)
}
