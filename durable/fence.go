package durable

import (
	"context"
	"errors"
)

// fence names the lease a [Store.Lead] call holds: the job's row in the lease
// table leases, and the holder's name. fn's context carries it, and the
// Store's writes that a lease's holder makes ([Store.Complete],
// [Store.Release], [Store.Postpone], [Store.MarkScanned]) run under it when
// the lease table is the one beside their own table (see fenced in sql.go).
type fence struct {
	leases, job, holder string
}

type fenceKey struct{}

// withFence returns ctx carrying f for the Store's writes made with it.
func withFence(ctx context.Context, f fence) context.Context {
	return context.WithValue(ctx, fenceKey{}, f)
}

// fence returns the lease ctx carries for s's table, if any.
func (s *Store) fence(ctx context.Context) (fence, bool) {
	f, ok := ctx.Value(fenceKey{}).(fence)
	return f, ok && f.leases == besideTable(s.table, "_leases")
}

// errFenced is the cause of a write refused by its fence.
var errFenced = errors.New("its lease has passed or changed hands: nothing written")

// writeFenced runs the fenced statement sql (see fenced) with args, then
// f's job and holder, then notify's arguments, and reports whether it
// changed a row. It returns an error wrapping [ErrLeaseLost] when the lease
// was not f's to use: the statement changed nothing.
func (s *Store) writeFenced(ctx context.Context, op string, f fence, sql string, args []any, notify ...any) (bool, error) {
	args = append(append(append([]any{}, args...), f.job, f.holder), notify...)
	var (
		held    bool
		changed int64
	)
	if err := s.db.QueryRow(ctx, sql, args...).Scan(&held, &changed); err != nil {
		return false, translate(op, err)
	}
	if !held {
		return false, &opError{op: op, kind: ErrLeaseLost, err: errFenced}
	}
	return changed > 0, nil
}
