package durable

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is the narrow interface the Store runs its statements through. Both
// *pgxpool.Pool and pgx.Tx (and *pgx.Conn) satisfy it, so a caller can run the
// store inside its own transaction with [Store.WithDB].
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Beginner is a DB that can start a transaction. [Migrate] needs one so that
// it can hold a transaction-scoped advisory lock. *pgxpool.Pool, *pgx.Conn
// and pgx.Tx (as a savepoint) satisfy it.
type Beginner interface {
	DB
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Fingerprint is the SHA-256 digest that tells a retry of a request from a
// different request sent under the same key.
type Fingerprint [32]byte

// Token is a random 16-byte identifier: the owner token of a claim (only the
// owner can complete or release the row it claimed) or the intent of a key
// (Record.Intent). The zero Token is never a valid one.
type Token [16]byte

// Answer is a finished response as stored: the status, the headers a client
// acts on and the body. A nil Header or Body is stored as empty.
type Answer struct {
	Status int
	Header http.Header
	Body   []byte
}

// Equal reports whether a and b replay the same: same status, same body,
// and the same values for every header (a nil and an empty Header, Body or
// value list are the same, as they are once stored).
func (a Answer) Equal(b Answer) bool {
	if a.Status != b.Status || !bytes.Equal(a.Body, b.Body) {
		return false
	}
	return sameHeaders(a.Header, b.Header) && sameHeaders(b.Header, a.Header)
}

// sameHeaders reports whether every non-empty value list of a is in b.
func sameHeaders(a, b http.Header) bool {
	for k, v := range a {
		if len(v) > 0 && !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// Record is one row of the idempotency table.
type Record struct {
	Scope       string
	Key         string
	Fingerprint Fingerprint
	// Owner is the token of the key's current attempt: the owner checks of
	// Complete and Release compare it.
	Owner Token
	// Intent is the key's intent: drawn by its first claim and kept by every
	// attempt that takes it over after a release, until the key expires.
	Intent Token
	// Attempt is which claim of the intent the row is on: 1, then one more
	// per release taken over by a retry.
	Attempt int
	// Answer is nil while the request is in progress.
	Answer *Answer
	// CreatedAt is the database time of the current attempt's claim.
	CreatedAt time.Time
	// HoldUntil is the database time by which the current attempt's
	// execution has ended for sure (its claim + ClaimParams.Hold); zero on
	// rows claimed before migration 0005.
	HoldUntil   time.Time
	CompletedAt time.Time // zero while in progress
	// ReleasedAt is when the current attempt was released (nothing
	// happened); zero otherwise. Only Claim returns a released row: to a
	// claim with another fingerprint, which is refused.
	ReleasedAt time.Time
	// TTL is how long the row still lived when the statement that
	// returned it ran, as the database's clock counts it: Retention after
	// its answer; for a row in progress, which never expires, Retention
	// (the least its answer, written later, will live). A caller that
	// keeps a copy of the row counts it down on its own monotonic clock
	// from before it sent the statement, never comparing host clocks
	// with the database's.
	TTL time.Duration
}

// InProgress reports whether the row has no answer yet.
func (r Record) InProgress() bool { return r.Answer == nil }

// Errors returned by the Store. Compare with errors.Is.
var (
	// ErrNotFound: no live (unexpired) row for that scope and key.
	ErrNotFound = errors.New("durable: not found")
	// ErrNotOwner: the live row for that scope and key was claimed under
	// another owner token.
	ErrNotOwner = errors.New("durable: not the owner of an in-progress row")
	// ErrCompleted: the live row for that scope and key already has an
	// answer, so it can no longer be completed, settled or released.
	ErrCompleted = errors.New("durable: row already has an answer")
	// ErrExists: a write hit the unique constraint on (user_id, key). The
	// Store's own statements never raise it; it comes from a caller's SQL
	// through a shared transaction.
	ErrExists = errors.New("durable: row exists")
	// ErrInvalid: the database refused an argument (e.g. a NUL byte in a
	// text column, an out-of-range status). Nothing was written.
	ErrInvalid = errors.New("durable: invalid argument")
)
