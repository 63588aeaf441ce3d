package reconcile

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemguard/idem/durable"
)

// The reconciler's own statements over the idempotency table: which
// in-progress rows are due, the backoff of those whose outcome is still
// unknown (the columns of migration 0002), and how far it has scanned (the
// table of migration 0003). Settling and releasing go through the Guard.
// Each is one round trip, run while the reconciler holds its lease.
//
// No index lists in-progress rows: one whose predicate reads response_status
// would make every answer write a non-HOT update (migration 0003). A run
// finds due rows in two places instead:
//
//   - postponed rows, whose reconcile_after is set, through the partial index
//     on reconcile_after, which holds only them;
//   - rows never looked at, created between the last run's high-water mark
//     (minus an overlap) and now - MinAge, through the created_at index: a
//     range of the rows created since the last run, not the whole day.
const (
	// $1 retention, $2 limit (microseconds). The rows whose backoff ended,
	// in the order it ended.
	listPostponedSQL = `
SELECT user_id, key, request_hash, owner_token, created_at, reconcile_attempts FROM %[1]s
WHERE reconcile_after IS NOT NULL AND reconcile_after <= now()
	AND response_status IS NULL AND created_at >= now() - $1::bigint * interval '1 microsecond'
ORDER BY reconcile_after, user_id, key
LIMIT $2`

	// $1, $2, $3 the cursor (created_at, user_id, key) to list after; $4 the
	// end of the window; $5 limit. Oldest first.
	listNewSQL = `
SELECT user_id, key, request_hash, owner_token, created_at, reconcile_attempts FROM %[1]s
WHERE created_at >= $1 AND created_at <= $4
	AND (created_at, user_id, key) > ($1, $2, $3)
	AND response_status IS NULL AND reconcile_after IS NULL
ORDER BY created_at, user_id, key
LIMIT $5`

	// $1 retention, $2 min age, $3 overlap (microseconds). The window of a
	// scan of new rows: from the mark of the last scan less the overlap (or
	// the start of the retention, for the first scan), to now - min age.
	windowSQL = `
SELECT greatest(
		(SELECT scanned_to FROM %[2]s) - $3::bigint * interval '1 microsecond',
		now() - $1::bigint * interval '1 microsecond'),
	now() - $2::bigint * interval '1 microsecond'`

	// $1 the new mark.
	markSQL = `
INSERT INTO %[2]s AS s (singleton, scanned_to) VALUES (true, $1)
ON CONFLICT (singleton) DO UPDATE SET scanned_to = excluded.scanned_to, updated_at = now()`

	// $1 scope, $2 key, $3 owner, $4 attempts, $5 delay, $6 retention. The
	// owner check keeps the backoff on the intent that was listed.
	postponeSQL = `
UPDATE %[1]s SET
	reconcile_attempts = $4,
	reconcile_after    = now() + $5::bigint * interval '1 microsecond'
WHERE user_id = $1 AND key = $2 AND owner_token = $3
	AND response_status IS NULL AND created_at >= now() - $6::bigint * interval '1 microsecond'`
)

// dueRow is an in-progress row to look at now, with its reconciliation state.
type dueRow struct {
	Scope, Key  string
	Fingerprint durable.Fingerprint
	Owner       durable.Token
	CreatedAt   time.Time
	Attempts    int // earlier attempts that could not learn the outcome
}

// cursor is a position in the scan of new rows, in their order.
type cursor struct {
	CreatedAt  time.Time
	Scope, Key string
}

// after is the cursor just past d.
func (d dueRow) after() cursor { return cursor{d.CreatedAt, d.Scope, d.Key} }

// rows runs the reconciler's statements on one table.
type rows struct {
	listPostponedSQL, listNewSQL, windowSQL, markSQL, postponeSQL string // for this table
	retention                                                     int64  // microseconds
}

func newRows(store Store) rows {
	t := store.Table()
	state := stateTable(t)
	f := func(sql string) string { return fmt.Sprintf(sql, t, state) }
	return rows{
		listPostponedSQL: f(listPostponedSQL),
		listNewSQL:       f(listNewSQL),
		windowSQL:        f(windowSQL),
		markSQL:          f(markSQL),
		postponeSQL:      f(postponeSQL),
		retention:        store.Retention().Microseconds(),
	}
}

// stateTable names the reconciler's table beside the quoted, qualified
// table t: migration 0003 creates it as the table's name + "_reconcile".
func stateTable(t string) string {
	if strings.HasSuffix(t, `"`) {
		return t[:len(t)-1] + `_reconcile"`
	}
	return t + "_reconcile"
}

// listPostponed lists up to limit live in-progress rows whose backoff ended.
func (r rows) listPostponed(ctx context.Context, db durable.DB, limit int) ([]dueRow, error) {
	return collect(db.Query(ctx, r.listPostponedSQL, r.retention, limit))
}

// window returns where the scan of new rows starts and ends: rows created
// in (from, to] that are in progress and were never postponed are due.
func (r rows) window(ctx context.Context, db durable.DB, minAge, overlap time.Duration) (from, to time.Time, err error) {
	err = db.QueryRow(ctx, r.windowSQL, r.retention, minAge.Microseconds(), overlap.Microseconds()).Scan(&from, &to)
	return from, to, err
}

// listNew lists up to limit rows after c and created no later than to, in
// progress and never postponed, oldest first.
func (r rows) listNew(ctx context.Context, db durable.DB, c cursor, to time.Time, limit int) ([]dueRow, error) {
	return collect(db.Query(ctx, r.listNewSQL, c.CreatedAt, c.Scope, c.Key, to, limit))
}

// mark records that every row created at or before to has been looked at.
func (r rows) mark(ctx context.Context, db durable.DB, to time.Time) error {
	_, err := db.Exec(ctx, r.markSQL, to)
	return err
}

func collect(rs pgx.Rows, err error) ([]dueRow, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, func(row pgx.CollectableRow) (dueRow, error) {
		var (
			d           dueRow
			hash, owner []byte
			attempts    int32
		)
		if err := row.Scan(&d.Scope, &d.Key, &hash, &owner, &d.CreatedAt, &attempts); err != nil {
			return dueRow{}, err
		}
		if len(hash) != len(d.Fingerprint) || len(owner) != len(d.Owner) {
			return dueRow{}, fmt.Errorf("row has a %d-byte request_hash and a %d-byte owner_token", len(hash), len(owner))
		}
		copy(d.Fingerprint[:], hash)
		copy(d.Owner[:], owner)
		d.Attempts = int(attempts)
		return d, nil
	})
}

// errGone: the row postponed is no longer the in-progress claim that was
// listed (finished, released, expired or claimed anew).
var errGone = errors.New("reconcile: the key changed since it was listed")

// postponeKey records one more failed attempt on the claim of owner and
// hides it for delay.
func (r rows) postponeKey(ctx context.Context, db durable.DB, d dueRow, attempts int, delay time.Duration) error {
	if attempts > math.MaxInt32 {
		attempts = math.MaxInt32
	}
	tag, err := db.Exec(ctx, r.postponeSQL, d.Scope, d.Key, d.Owner[:], int32(attempts), delay.Microseconds(), r.retention)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return errGone
	}
	return nil
}
