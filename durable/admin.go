package durable

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/migrations"
)

// What an operator reads and undoes by hand (the idem command, cmd/idem): a
// key's whole row whatever its state, the keys that wait for reconciliation,
// the table's counts per state, the migrations applied, and a migration
// undone one version at a time. They only read, except [MigrateDownTo]:
// settling and releasing a key by hand go through [Store.Complete] and
// [Store.Release], the owner-checked writes the Guard and the reconciler use.

// States of a [KeyRow].
const (
	// StateInProgress: claimed, no answer yet. Such a row never expires.
	StateInProgress = "in_progress"
	// StateAnswered: the answer is stored and replayed to every retry.
	StateAnswered = "answered"
	// StateReleased: nothing happened; the next claim of the same request
	// takes the row over as the intent's next attempt.
	StateReleased = "released"
	// StateExpired: answered or released longer than its retention ago; the
	// next claim of the key takes it over as a new intent.
	StateExpired = "expired"
)

// KeyRow is a key's row as an operator sees it: the Record (with its TTL,
// negative once expired), its state, and what the database's clock says is
// left of the attempt's hold. Every duration is computed by the statement
// from the database's now(), never from the host's clock.
type KeyRow struct {
	idem.Record
	// State is StateInProgress, StateAnswered, StateReleased or
	// StateExpired.
	State string
	// HoldLeft is how long the current attempt's execution may still hold
	// the key (HoldUntil less the database's now()): negative once it has
	// passed, by as much.
	HoldLeft time.Duration
	// ReconcileAttempts is the number of failed reconciliation attempts of
	// the current attempt; ReconcileAfter is when the reconciler may try it
	// again (zero when it was never postponed).
	ReconcileAttempts int
	ReconcileAfter    time.Time
}

// Held reports whether the current attempt's execution may still be running:
// the row is in progress and its HoldUntil has not passed. Nobody but its
// owner should settle or release a held key.
func (r KeyRow) Held() bool { return r.State == StateInProgress && r.HoldLeft > 0 }

// StateCounts counts a table's rows per state (see [KeyRow.State]). Pending
// rows are in progress too: InProgress counts them.
type StateCounts struct {
	InProgress int64
	// Pending counts the rows in progress past their hold: they wait for
	// reconciliation (see [Store.ListPending]).
	Pending  int64
	Answered int64
	Released int64
	Expired  int64
}

// adminStatements are the statements of this file, built for a Store's
// table on first use.
type adminStatements struct {
	inspect, pending, counts string
}

// adminColumns follow columns in the select list of inspect and pending:
// state, hold left and reconciliation state, as scanKeyRow reads them.
const adminColumns = `CASE WHEN coalesce(` + expired + `, false) THEN '` + StateExpired + `'
		WHEN released_at IS NOT NULL THEN '` + StateReleased + `'
		WHEN response_status IS NOT NULL THEN '` + StateAnswered + `'
		ELSE '` + StateInProgress + `' END,
	(extract(epoch FROM hold_until - now()) * 1000000)::bigint,
	reconcile_attempts, reconcile_after`

// inProgress is the condition of a row in progress, and pending that of one
// past its hold by the database's clock (what an operator reads; the
// reconciler decides on its own clock).
const (
	inProgress = "response_status IS NULL AND released_at IS NULL"
	pending    = inProgress + " AND hold_until <= now()"
)

func newAdminStatements(t string) *adminStatements {
	r := strings.NewReplacer("{t}", t, "{cols}", columns)
	return &adminStatements{
		// $1 scope, $2 key. The row whatever its state.
		inspect: r.Replace(`
SELECT {cols}, ` + adminColumns + ` FROM {t}
WHERE user_id = $1 AND key = $2`),

		// $1 limit. Oldest first, through the created_at index; no index
		// lists rows in progress (the answer write stays HOT), so the scan
		// passes over the answered rows older than the oldest pending one.
		pending: r.Replace(`
SELECT {cols}, ` + adminColumns + ` FROM {t}
WHERE ` + pending + `
ORDER BY created_at, user_id, key
LIMIT $1`),

		// Reads the whole table.
		counts: r.Replace(`
SELECT count(*) FILTER (WHERE ` + inProgress + `),
	count(*) FILTER (WHERE ` + pending + `),
	count(*) FILTER (WHERE response_status IS NOT NULL AND NOT coalesce(` + expired + `, false)),
	count(*) FILTER (WHERE released_at IS NOT NULL AND NOT coalesce(` + expired + `, false)),
	count(*) FILTER (WHERE coalesce(` + expired + `, false))
FROM {t}`),
	}
}

func (s *Store) admin() *adminStatements { return newAdminStatements(s.table) }

// Inspect returns the row of a key whatever its state: in progress, answered,
// released or expired (not yet swept). It returns idem.ErrNotFound when the
// key has no row. It is one statement.
func (s *Store) Inspect(ctx context.Context, scope, key string) (KeyRow, error) {
	const op = "inspect"
	if err := checkKey(op, scope, key); err != nil {
		return KeyRow{}, err
	}
	if err := s.schema.ready(ctx, s.db, op, s.table); err != nil {
		return KeyRow{}, err
	}
	row, err := s.scanKeyRow(s.db.QueryRow(ctx, s.admin().inspect, scope, key))
	if err != nil {
		return KeyRow{}, translate(op, err)
	}
	return row, nil
}

// ListPending lists up to limit keys that wait for reconciliation, oldest
// (by their attempt's claim) first: in progress and past their hold, the
// keys whose retries get idem.ErrPending. It is one statement, in the order
// of the created_at index; no index holds only rows in progress, so it also
// passes over the rows older than the oldest pending one.
func (s *Store) ListPending(ctx context.Context, limit int) ([]KeyRow, error) {
	const op = "list pending"
	if limit < 1 {
		return nil, invalid(op, fmt.Sprintf("limit %d is not positive", limit))
	}
	if err := s.schema.ready(ctx, s.db, op, s.table); err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, s.admin().pending, limit)
	if err != nil {
		return nil, translate(op, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (KeyRow, error) { return s.scanKeyRow(row) })
	return out, translate(op, err)
}

// CountStates counts the table's rows per state. It is one statement, which
// reads the whole table.
func (s *Store) CountStates(ctx context.Context) (StateCounts, error) {
	var c StateCounts
	if err := s.schema.ready(ctx, s.db, "count states", s.table); err != nil {
		return c, err
	}
	err := s.db.QueryRow(ctx, s.admin().counts).Scan(
		&c.InProgress, &c.Pending, &c.Answered, &c.Released, &c.Expired)
	return c, translate("count states", err)
}

func (s *Store) scanKeyRow(row pgx.Row) (KeyRow, error) {
	var (
		r        KeyRow
		holdLeft int64
		attempts int32
		after    *time.Time
	)
	rec, err := s.scanRecord(row, &r.State, &holdLeft, &attempts, &after)
	if err != nil {
		return KeyRow{}, err
	}
	r.Record = rec
	r.HoldLeft = time.Duration(holdLeft) * time.Microsecond
	r.ReconcileAttempts = int(attempts)
	if after != nil {
		r.ReconcileAfter = *after
	}
	return r, nil
}

// MigrationVersion is one migration version of a table, as
// [MigrationStatus] reports it.
type MigrationVersion struct {
	Version int64
	// Name is the up file's name, such as 0001_create_idempotency_keys.up.sql;
	// empty for a version applied by a newer build, whose file this build
	// does not have.
	Name string
	// Applied reports whether the version is applied to the table;
	// AppliedAt is when, on the database's clock.
	Applied   bool
	AppliedAt time.Time
}

// MigrationStatus reports, in version order, every migration this build
// embeds (package migrations) and every version applied to the table of cfg
// (a nil cfg gives the defaults), and whether each is applied. It only
// reads: with no version table yet, every version is unapplied.
func MigrationStatus(ctx context.Context, db DB, cfg *Config) ([]MigrationVersion, error) {
	const op = "migration status"
	if db == nil {
		return nil, errNilDB
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	files, err := loadMigrations(migrations.FS)
	if err != nil {
		return nil, &opError{op: op, err: err}
	}
	out := make([]MigrationVersion, len(files))
	for i, m := range files {
		out[i] = MigrationVersion{Version: m.version, Name: m.upName}
	}
	vt := c.qualifiedAs(versionTable)
	var exists bool
	if err := db.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", vt).Scan(&exists); err != nil {
		return nil, &opError{op: op, err: err}
	}
	if !exists {
		return out, nil
	}
	rows, err := db.Query(ctx, "SELECT version, applied_at FROM "+vt+" WHERE table_name = $1 ORDER BY version", table)
	if err != nil {
		return nil, &opError{op: op, err: err}
	}
	applied, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		V  int64
		At time.Time
	}])
	if err != nil {
		return nil, &opError{op: op, err: err}
	}
	for _, a := range applied {
		i := slices.IndexFunc(out, func(m MigrationVersion) bool { return m.Version == a.V })
		if i < 0 {
			out = append(out, MigrationVersion{Version: a.V})
			i = len(out) - 1
		}
		out[i].Applied, out[i].AppliedAt = true, a.At
	}
	slices.SortFunc(out, func(a, b MigrationVersion) int { return cmp.Compare(a.Version, b.Version) })
	return out, nil
}

// MigrateDownTo undoes, as [MigrateDown] does, the migrations applied to the
// table of cfg whose version is above version, newest first; version 0
// undoes them all. It is a no-op when none is above it. Like [Migrate] it
// runs in one transaction under the same advisory lock.
//
// WARNING: undoing migration 1 deletes every stored key and answer of the
// table; undoing a later one drops what it added (columns, tables).
func MigrateDownTo(ctx context.Context, db Beginner, cfg *Config, version int64) error {
	if version < 0 {
		return &opError{op: "migrate down", kind: idem.ErrInvalid, err: errors.New("version " + strconv.FormatInt(version, 10) + " is negative")}
	}
	return migrate(ctx, db, cfg, true, version)
}
