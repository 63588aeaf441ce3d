package reconcile

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemguard/idem"
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
//
// A row is the reconciler's only once its execution has ended for sure: past
// its own deadline, hold_until (the claim's now() plus the MaxHold of the
// Guard that claimed it, migration 0005), whatever the Guard the reconciler
// was built with. MinAge is then a margin on top. A row claimed before
// migration 0005 has no hold_until, and MinAge alone protects it. Released
// rows are not in progress: no claim holds them.
const (
	// dueColumns is the select list of both listings; the last column says
	// whether the row is past its own deadline.
	dueColumns = `user_id, key, request_hash, owner_token, coalesce(intent_id, owner_token), coalesce(attempt, 1),
	created_at, reconcile_attempts, coalesce(hold_until <= now(), true)`

	// $1 limit. The rows whose backoff (or deadline, see deferSQL) ended,
	// in the order it ended. A row in progress never expires, so no
	// retention bounds the list.
	listPostponedSQL = `
SELECT ` + dueColumns + ` FROM %[1]s
WHERE reconcile_after IS NOT NULL AND reconcile_after <= now()
	AND response_status IS NULL AND released_at IS NULL
ORDER BY reconcile_after, user_id, key
LIMIT $1`

	// $1, $2, $3 the cursor (created_at, user_id, key) to list after; $4 the
	// end of the window; $5 limit. Oldest first.
	listNewSQL = `
SELECT ` + dueColumns + ` FROM %[1]s
WHERE created_at >= $1 AND created_at <= $4
	AND (created_at, user_id, key) > ($1, $2, $3)
	AND response_status IS NULL AND released_at IS NULL AND reconcile_after IS NULL
ORDER BY created_at, user_id, key
LIMIT $5`

	// $1 min age, $2 overlap (microseconds). The window of a scan of new
	// rows: from the mark of the last scan less the overlap (or the oldest
	// row, for the very first scan: a row in progress never expires, so no
	// retention bounds what is left to look at), to now - min age. The
	// oldest row is the first entry of the created_at index; an empty table
	// gives an empty window.
	windowSQL = `
SELECT coalesce(
		(SELECT scanned_to FROM %[2]s) - $2::bigint * interval '1 microsecond',
		(SELECT min(created_at) FROM %[1]s),
		now() - $1::bigint * interval '1 microsecond'),
	now() - $1::bigint * interval '1 microsecond'`

	// $1 the new mark.
	markSQL = `
INSERT INTO %[2]s AS s (singleton, scanned_to) VALUES (true, $1)
ON CONFLICT (singleton) DO UPDATE SET scanned_to = excluded.scanned_to, updated_at = now()`

	// $1 scope, $2 key, $3 owner, $4 attempts, $5 delay. The owner check
	// keeps the backoff on the attempt that was listed.
	postponeSQL = `
UPDATE %[1]s SET
	reconcile_attempts = $4,
	reconcile_after    = now() + $5::bigint * interval '1 microsecond'
WHERE user_id = $1 AND key = $2 AND owner_token = $3
	AND response_status IS NULL AND released_at IS NULL`

	// $1 scope, $2 key, $3 owner. Hides a row listed before its deadline
	// until the deadline, without counting an attempt: the postponed
	// listing finds it then.
	deferSQL = `
UPDATE %[1]s SET reconcile_after = hold_until
WHERE user_id = $1 AND key = $2 AND owner_token = $3
	AND response_status IS NULL AND released_at IS NULL`
)

// dueRow is an in-progress row to look at now, with its reconciliation state.
type dueRow struct {
	Scope, Key  string
	Fingerprint idem.Fingerprint
	Owner       idem.Token // the attempt's
	Intent      idem.Token
	Attempt     int // which attempt of the intent
	CreatedAt   time.Time
	Attempts    int  // earlier attempts that could not learn the outcome
	Ended       bool // past its own deadline (hold_until), on the database clock
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
	listPostponedSQL, listNewSQL, windowSQL, markSQL, postponeSQL, deferSQL string // for this table
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
		deferSQL:         f(deferSQL),
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

// listPostponed lists up to limit in-progress rows whose backoff ended.
func (r rows) listPostponed(ctx context.Context, db durable.DB, limit int) ([]dueRow, error) {
	return collect(db.Query(ctx, r.listPostponedSQL, limit))
}

// window returns where the scan of new rows starts and ends: rows created
// in (from, to] that are in progress and were never postponed are due.
func (r rows) window(ctx context.Context, db durable.DB, minAge, overlap time.Duration) (from, to time.Time, err error) {
	err = db.QueryRow(ctx, r.windowSQL, minAge.Microseconds(), overlap.Microseconds()).Scan(&from, &to)
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
			d                   dueRow
			hash, owner, intent []byte
			attempt, attempts   int32
		)
		if err := row.Scan(&d.Scope, &d.Key, &hash, &owner, &intent, &attempt, &d.CreatedAt, &attempts, &d.Ended); err != nil {
			return dueRow{}, err
		}
		if len(hash) != len(d.Fingerprint) || len(owner) != len(d.Owner) || len(intent) != len(d.Intent) {
			return dueRow{}, fmt.Errorf("row has a %d-byte request_hash, a %d-byte owner_token and a %d-byte intent_id",
				len(hash), len(owner), len(intent))
		}
		copy(d.Fingerprint[:], hash)
		copy(d.Owner[:], owner)
		copy(d.Intent[:], intent)
		d.Attempt, d.Attempts = int(attempt), int(attempts)
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
	tag, err := db.Exec(ctx, r.postponeSQL, d.Scope, d.Key, d.Owner[:], int32(attempts), delay.Microseconds())
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return errGone
	}
	return nil
}

// deferKey hides the in-progress row of d's attempt until its deadline.
func (r rows) deferKey(ctx context.Context, db durable.DB, d dueRow) error {
	tag, err := db.Exec(ctx, r.deferSQL, d.Scope, d.Key, d.Owner[:])
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return errGone
	}
	return nil
}
