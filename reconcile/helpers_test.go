package reconcile_test

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// nopDB is a durable.DB that must never be used.
type nopDB struct{}

func (nopDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	panic("nopDB used")
}
func (nopDB) Query(context.Context, string, ...any) (pgx.Rows, error) { panic("nopDB used") }
func (nopDB) QueryRow(context.Context, string, ...any) pgx.Row        { panic("nopDB used") }
