package durable

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// errStatementCache names what a lost prepared statement means: pgx's
// default statement cache (QueryExecModeCacheStatement) keeps named
// statements per client connection, and a pooler in transaction mode that
// does not track them (PgBouncer before 1.21, or without
// max_prepared_statements) runs the next transaction on a server
// connection that lacks them, or already has one of that name.
var errStatementCache = errors.New("prepared statements are lost between transactions, as behind a connection pooler in transaction mode: connect with default_query_exec_mode=cache_describe (or exec), or set PgBouncer's max_prepared_statements (1.21 or later)")

// statementLost reports whether err is a server's answer to a prepared
// statement a pooler lost or mixed up: 26000 (invalid_sql_statement_name:
// it does not exist on this server connection) or 42P05
// (duplicate_prepared_statement: another client's of that name is there).
func statementLost(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && (pgErr.Code == "26000" || pgErr.Code == "42P05")
}

// poolerCheckTimeout bounds each step of checkStatements.
const poolerCheckTimeout = 2 * time.Second

// checkStatements reports errStatementCache when pool's connections cache
// prepared statements (pgx's default) and lose them between transactions.
// It prepares a statement on one connection, pins another connection in a
// transaction (a pooler in transaction mode hands it the server connection
// just released, the one holding the statement), then runs the statement
// again on the first: directly on PostgreSQL it runs on the same server
// process; behind PgBouncer 1.18 it meets a server connection without it.
// When the check cannot conclude (a pool of one connection, no second one
// free, a pooler with one server connection, which would wait), it reports
// nothing: the
// statements' own errors still name the cause (see translate).
func checkStatements(ctx context.Context, pool *pgxpool.Pool) error {
	if pool.Config().MaxConns < 2 || pool.Config().ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		return nil
	}
	a, err := acquireWithin(ctx, pool)
	if err != nil {
		return nil
	}
	defer a.Release()
	name := "idem_check_" + rand.Text()
	if _, err := a.Conn().Prepare(ctx, name, "SELECT 1"); err != nil {
		return nil
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), poolerCheckTimeout)
		_ = a.Conn().Deallocate(dctx, name)
		cancel()
	}()
	b, err := acquireWithin(ctx, pool)
	if err != nil {
		return nil
	}
	defer b.Release()
	tctx, cancel := context.WithTimeout(ctx, poolerCheckTimeout)
	defer cancel()
	tx, err := b.Begin(tctx)
	if err != nil {
		return nil
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(tctx, "SELECT 1"); err != nil {
		return nil
	}
	var one int
	if err := a.QueryRow(tctx, name).Scan(&one); statementLost(err) {
		return &opError{op: "check the connection", kind: errStatementCache, err: err}
	}
	return nil
}

func acquireWithin(ctx context.Context, pool *pgxpool.Pool) (*pgxpool.Conn, error) {
	actx, cancel := context.WithTimeout(ctx, poolerCheckTimeout)
	defer cancel()
	c, err := pool.Acquire(actx)
	if err != nil {
		return nil, fmt.Errorf("acquire: %w", err)
	}
	return c, nil
}
