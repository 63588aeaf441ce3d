package durable

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemguard/idem"
)

// The reconciler's statements on the table (package reconcile calls them):
// which in-progress rows are due, the backoff of those whose outcome is still
// unknown (reconcile_attempts, reconcile_after), and how far the reconciler has
// scanned (the <table>_reconcile row). Settling and
// releasing go through the Guard. Each method is one round trip, except
// where a write finds nothing to change (see [Store.Postpone]); run them
// while holding the reconciler's lease, with the context of [Store.Lead],
// which fences the writes (Postpone, MarkScanned, and the Guard's settle and
// release through [Store.Complete] and [Store.Release]) by that lease.

// Due is an in-progress row a reconciler is to look at: the attempt that
// holds the key, and its reconciliation state.
type Due struct {
	Scope, Key  string
	Fingerprint idem.Fingerprint
	Owner       idem.Token // the attempt's: Postpone acts on it only
	Intent      idem.Token
	Attempt     int       // which attempt of the intent
	CreatedAt   time.Time // the attempt's claim, on the database clock
	// Attempts is the number of earlier reconciliation attempts that could
	// not learn the outcome.
	Attempts int
	// Hold is how long the attempt's execution may hold the key: hold_until
	// less created_at, both its claim's now, so a duration that no clock
	// step changes.
	Hold time.Duration
}

func newBacklog(table, state string) *backlogStatements {
	st := newBacklogStatements(table, state)
	return &st
}

// ListPostponed lists up to limit in-progress rows whose backoff has ended,
// in the order it ended.
func (s *Store) ListPostponed(ctx context.Context, limit int) ([]Due, error) {
	if err := s.schema.ready(ctx, s.db, "list postponed", s.table); err != nil {
		return nil, err
	}
	ds, err := collectDue(s.db.Query(ctx, s.backlog.listPostponed, limit))
	return ds, translate("list postponed", err)
}

// ScanWindow returns where a scan of new rows starts and ends: the rows
// created in [from, to] that are in progress and were never postponed are
// due. to is now - minAge; from is the last scan's mark (see
// [Store.MarkScanned]) less overlap, or, before any scan, the oldest row's
// created_at.
func (s *Store) ScanWindow(ctx context.Context, minAge, overlap time.Duration) (from, to time.Time, err error) {
	if err := s.schema.ready(ctx, s.db, "scan window", s.table); err != nil {
		return time.Time{}, time.Time{}, err
	}
	err = s.db.QueryRow(ctx, s.backlog.window, minAge.Microseconds(), overlap.Microseconds()).Scan(&from, &to)
	return from, to, translate("scan window", err)
}

// ListNew lists up to limit rows after the position of after (its
// CreatedAt, Scope and Key, in that order; Due{CreatedAt: from} for the
// first page) and created no later than to, in progress and never
// postponed, oldest first.
func (s *Store) ListNew(ctx context.Context, after Due, to time.Time, limit int) ([]Due, error) {
	ds, err := collectDue(s.db.Query(ctx, s.backlog.listNew, after.CreatedAt, after.Scope, after.Key, to, limit))
	return ds, translate("list new", err)
}

// MarkScanned records that every row created at or before to has been
// looked at: the next [Store.ScanWindow] starts there, less its overlap.
// Under a lease (ctx from [Store.Lead]) it writes nothing once the lease has
// passed, and returns an error wrapping [ErrLeaseLost].
func (s *Store) MarkScanned(ctx context.Context, to time.Time) error {
	const op = "mark scanned"
	if f, ok := s.fence(ctx); ok {
		_, err := s.writeFenced(ctx, op, f, s.backlog.markFenced, []any{to})
		return err
	}
	_, err := s.db.Exec(ctx, s.backlog.mark, to)
	return translate(op, err)
}

// Postpone records attempts failed reconciliation attempts on the attempt
// d names (d.Scope, d.Key, d.Owner) and hides its row from the listings for
// delay. When that attempt no longer holds the key in progress, one more
// statement tells why, as for [Store.Complete]: idem.ErrNotFound (no live
// row, or released), idem.ErrNotOwner (another attempt) or
// idem.ErrCompleted (answered). Under a lease (ctx from [Store.Lead]) it
// changes nothing once the lease has passed, and returns an error wrapping
// [ErrLeaseLost].
func (s *Store) Postpone(ctx context.Context, d Due, attempts int, delay time.Duration) error {
	const op = "postpone"
	attempts = min(attempts, math.MaxInt32)
	args := []any{d.Scope, d.Key, d.Owner[:], int32(attempts), delay.Microseconds()}
	var postponed bool
	if f, ok := s.fence(ctx); ok {
		var err error
		if postponed, err = s.writeFenced(ctx, op, f, s.backlog.postponeFenced, args); err != nil {
			return err
		}
	} else {
		tag, err := s.db.Exec(ctx, s.backlog.postpone, args...)
		if err != nil {
			return translate(op, err)
		}
		postponed = tag.RowsAffected() > 0
	}
	if !postponed {
		return s.why(ctx, op, d.Scope, d.Key, d.Owner)
	}
	return nil
}

func collectDue(rs pgx.Rows, err error) ([]Due, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, func(row pgx.CollectableRow) (Due, error) {
		var (
			d                   Due
			hash, owner, intent []byte
			attempt, attempts   int32
			holdUntil           time.Time
		)
		if err := row.Scan(&d.Scope, &d.Key, &hash, &owner, &intent, &attempt, &d.CreatedAt, &attempts, &holdUntil); err != nil {
			return Due{}, err
		}
		d.Hold = holdUntil.Sub(d.CreatedAt)
		if len(hash) != len(d.Fingerprint) || len(owner) != len(d.Owner) || len(intent) != len(d.Intent) {
			return Due{}, fmt.Errorf("row has a %d-byte request_hash, a %d-byte owner_token and a %d-byte intent_id",
				len(hash), len(owner), len(intent))
		}
		copy(d.Fingerprint[:], hash)
		copy(d.Owner[:], owner)
		copy(d.Intent[:], intent)
		d.Attempt, d.Attempts = int(attempt), int(attempts)
		return d, nil
	})
}
