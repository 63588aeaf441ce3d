package reconcile

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemguard/idem/durable"
)

// The reconciler's own statements over the idempotency table: which
// in-progress rows are due, and the backoff of those whose outcome is still
// unknown (the columns of migration 0002). Settling and releasing go through
// the Guard. Each is one round trip, run on the connection that holds the
// reconcile lock.
const (
	// $1 retention, $2 age, $3 limit (microseconds). Served by the partial
	// index on in-progress rows; postponed rows are filtered on the heap
	// (they are few: rows whose outcome is still unknown).
	listDueSQL = `
SELECT user_id, key, request_hash, owner_token, created_at, reconcile_attempts FROM %s
WHERE response_status IS NULL AND created_at >= now() - $1::bigint * interval '1 microsecond'
	AND created_at < now() - $2::bigint * interval '1 microsecond'
	AND (reconcile_after IS NULL OR reconcile_after <= now())
ORDER BY created_at, user_id, key
LIMIT $3`

	// $1 scope, $2 key, $3 owner, $4 attempts, $5 delay, $6 retention. The
	// owner check keeps the backoff on the intent that was listed.
	postponeSQL = `
UPDATE %s SET
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

// rows runs the reconciler's statements on one table.
type rows struct {
	listSQL, postponeSQL string // for this table
	retention            int64  // microseconds
}

func newRows(store Store) rows {
	t := store.Table()
	return rows{
		listSQL:     fmt.Sprintf(listDueSQL, t),
		postponeSQL: fmt.Sprintf(postponeSQL, t),
		retention:   store.Retention().Microseconds(),
	}
}

// listDue lists up to limit live in-progress rows created more than olderThan
// ago whose reconciliation is due, oldest first.
func (r rows) listDue(ctx context.Context, db durable.DB, olderThan time.Duration, limit int) ([]dueRow, error) {
	rs, err := db.Query(ctx, r.listSQL, r.retention, olderThan.Microseconds(), limit)
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

// postpone records one more failed attempt on the claim of owner and hides
// it for delay.
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
