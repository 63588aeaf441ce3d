package durable

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
)

// DueRecord is an in-progress row that a reconciler should look at now,
// with its reconciliation state.
type DueRecord struct {
	Record
	// Attempts is the number of earlier reconciliation attempts that could
	// not learn the outcome (the row's reconcile_attempts, as last set by
	// [Store.Postpone]). 0 for a row never tried.
	Attempts int
}

// ListDue returns up to limit live in-progress rows created more than
// olderThan ago whose reconciliation is due (never postponed, or postponed
// by [Store.Postpone] to a time now past on the database clock), oldest
// first. It is one statement, served by the partial index on in-progress
// rows. limit must be positive and olderThan not negative.
//
// Unlike [Store.ListInProgress], it skips rows postponed into the future.
// A row taken over after expiry starts with no reconciliation state.
func (s *Store) ListDue(ctx context.Context, olderThan time.Duration, limit int) ([]DueRecord, error) {
	const op = "list due"
	if limit < 1 {
		return nil, invalid(op, fmt.Sprintf("limit %d is not positive", limit))
	}
	if olderThan < 0 {
		return nil, invalid(op, fmt.Sprintf("olderThan %v is negative", olderThan))
	}
	rows, err := s.db.Query(ctx, s.sql.listDue, s.retention, olderThan.Microseconds(), limit)
	if err != nil {
		return nil, translate(op, err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (DueRecord, error) {
		var (
			d        DueRecord
			attempts int32
			err      error
		)
		d.Record, err = scanRecord(row, &attempts)
		d.Attempts = int(attempts)
		return d, err
	})
	if err != nil {
		return nil, translate(op, err)
	}
	return recs, nil
}

// Postpone records that a reconciliation attempt of the in-progress row
// claimed by owner could not learn its outcome: it sets the row's attempt
// count to attempts and hides the row from [Store.ListDue] until delay has
// passed on the database clock. The owner check makes sure that the row is
// still the intent the reconciler looked at, not a new one that took over the
// key since.
//
// It is one statement when it succeeds; otherwise one more tells ErrNotFound,
// ErrNotOwner and ErrCompleted apart, as for [Store.Complete]. attempts and
// delay must not be negative.
func (s *Store) Postpone(ctx context.Context, scope, key string, owner Token, attempts int, delay time.Duration) error {
	const op = "postpone"
	if err := checkKey(op, scope, key); err != nil {
		return err
	}
	if attempts < 0 || attempts > math.MaxInt32 {
		return invalid(op, fmt.Sprintf("attempts %d is outside 0..%d", attempts, math.MaxInt32))
	}
	if delay < 0 {
		return invalid(op, fmt.Sprintf("delay %v is negative", delay))
	}
	tag, err := s.db.Exec(ctx, s.sql.postpone, scope, key, owner[:], int32(attempts), delay.Microseconds(), s.retention)
	if err != nil {
		return translate(op, err)
	}
	if tag.RowsAffected() > 0 {
		return nil
	}
	return s.why(ctx, op, scope, key, &owner)
}
