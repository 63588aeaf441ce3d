package target

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
)

// statements are the durable store's own SQL texts for one table, as the
// ceiling issues them.
type statements struct {
	claim, get, complete string
}

// captureStatements returns the exact statements a *durable.Store of cfg
// sends, by running its calls once through a DB that records the SQL and
// answers "no row". The ceiling therefore always runs the store's current
// SQL, not a copy that could drift from durable/sql.go. The arguments the
// ceiling passes follow the store's order; TestTargetsAgree checks that both
// take the same decisions with the same writes.
func captureStatements(cfg *durable.Config) (statements, error) {
	var rec sqlRecorder
	store, err := durable.New(&rec, cfg)
	if err != nil {
		return statements{}, err
	}
	ctx := context.Background()
	p := idem.ClaimParams{Scope: "s", Key: "k", Owner: idem.Token{1}}
	a := idem.Response{Status: 201}
	var st statements
	_, _, _ = store.Claim(ctx, p) // claim, then get (the lost-race fallback)
	claimSQL := rec.take()
	_ = store.Complete(ctx, "s", "k", p.Owner, a) // complete, then the inspect that explains 0 rows
	completeSQL := rec.take()
	if len(claimSQL) < 2 || len(completeSQL) < 1 {
		return st, fmt.Errorf("capturing the store's statements: got %d and %d", len(claimSQL), len(completeSQL))
	}
	st.claim, st.get, st.complete = claimSQL[0], claimSQL[1], completeSQL[0]
	return st, nil
}

// sqlRecorder is a durable.DB that records statements and runs none.
type sqlRecorder struct{ sql []string }

func (r *sqlRecorder) take() []string {
	s := r.sql
	r.sql = nil
	return s
}

func (r *sqlRecorder) Exec(_ context.Context, sql string, _ ...any) (pgconn.CommandTag, error) {
	r.sql = append(r.sql, sql)
	return pgconn.NewCommandTag("UPDATE 0"), nil
}

func (r *sqlRecorder) Query(_ context.Context, sql string, _ ...any) (pgx.Rows, error) {
	r.sql = append(r.sql, sql)
	return nil, errors.New("sqlRecorder: Query not supported")
}

func (r *sqlRecorder) QueryRow(_ context.Context, sql string, _ ...any) pgx.Row {
	r.sql = append(r.sql, sql)
	return noRow{}
}

type noRow struct{}

func (noRow) Scan(...any) error { return pgx.ErrNoRows }
