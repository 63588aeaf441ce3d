package idem

import (
	"bytes"
	"context"
	"encoding/base32"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Store is what the Guard needs from the durable store: the contract every
// store implements. *durable.Store (PostgreSQL) and idemtest.MemStore (in
// memory) implement it, and idemtest.RunStoreSuite checks an implementation
// against it. A store used by a Guard must give every claim its own row:
// Claim decides who runs, and Complete and Release act only on the row of
// the owner that claimed it.
type Store interface {
	// Claim makes p.Owner the owner of the key when no live row holds it
	// (claimed == true, rec is the new row), or returns the row that holds
	// it (claimed == false): in progress, answered, or released under
	// another fingerprint. Among concurrent Claims of one key exactly one
	// wins. An expired row is taken over as a new intent; a released row,
	// by a claim with its fingerprint, as the next attempt of its intent.
	Claim(ctx context.Context, p ClaimParams) (rec Record, claimed bool, err error)
	// Get returns the live row of a key, or ErrNotFound when there is none
	// (or it was released, or has expired).
	Get(ctx context.Context, scope, key string) (Record, error)
	// Complete stores resp as the answer of the in-progress row owner
	// claimed. It fails with ErrNotFound, ErrNotOwner or ErrCompleted when
	// that row is not there to take it; completing it again with the same
	// answer is not an error.
	Complete(ctx context.Context, scope, key string, owner Token, resp Response) error
	// Release marks the in-progress row owner claimed released (nothing
	// happened), with the errors of Complete.
	Release(ctx context.Context, scope, key string, owner Token) error
	// Retention is how long a key lives after its answer (or release); a
	// key in progress never expires. The Guard refuses a retention not
	// longer than its MaxHold, and never caches an answer past its key's
	// expiry.
	Retention() time.Duration
}

// Joiner is a Store that can write an answer through a transaction of the
// caller's, for [Complete]. *durable.Store implements it for pgx
// transactions.
type Joiner interface {
	// Join returns the store with its writes bound to tx, or an error when
	// tx is not a transaction it can write through.
	Join(tx any) (Store, error)
}

// ClaimParams identifies a request that wants to run.
type ClaimParams struct {
	// Scope is the user the key belongs to: keys of different scopes never
	// meet. It must not contain NUL bytes and must be valid UTF-8.
	Scope string
	// Key is the Idempotency-Key sent by the client, with the same rules.
	Key string
	// Fingerprint tells a retry from a different request under the same key.
	Fingerprint Fingerprint
	// Owner is the caller's fresh random token; it must not be zero.
	Owner Token
	// Intent is a fresh random token for the key's intent, used when the
	// claim creates the key's row or takes over an expired one; a claim
	// that takes over a released row keeps that row's intent. Zero (the
	// Guard's choice): Owner is the intent, which lets a store keep no
	// separate copy of it (durable.Store's rows stay narrow and its answer
	// write HOT); the next attempt's owner differs all the same.
	Intent Token
	// Hold is how long the claimer's execution may hold the key (the
	// Guard's MaxHold): the row's HoldUntil is the store's now plus Hold,
	// and no reconciler acts on the row before. It must not be negative.
	Hold time.Duration
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
	Answer *Response
	// CreatedAt is the store's time of the current attempt's claim.
	CreatedAt time.Time
	// HoldUntil is the store's time by which the current attempt's
	// execution has ended for sure (its claim + ClaimParams.Hold).
	// HoldUntil less CreatedAt is the hold its claimer asked for, a
	// duration: both are the claim's now.
	HoldUntil time.Time
	// Age is how old the current attempt was when the statement that
	// returned the row ran: the store's now less CreatedAt, both on the
	// store's clock. With the hold, it tells how long the attempt's
	// execution may still run without comparing any host's clock with the
	// store's (see Guard.MaxHold).
	Age         time.Duration
	CompletedAt time.Time // zero while in progress
	// ReleasedAt is when the current attempt was released (nothing
	// happened); zero otherwise. Only Claim returns a released row: to a
	// claim with another fingerprint, which is refused.
	ReleasedAt time.Time
	// TTL is how long the row still lived when the statement that
	// returned it ran, as the store's clock counts it: Retention after
	// its answer; for a row in progress, which never expires, Retention
	// (the least its answer, written later, will live). A caller that
	// keeps a copy of the row counts it down on its own monotonic clock
	// from before it sent the statement, never comparing host clocks
	// with the store's.
	TTL time.Duration
}

// InProgress reports whether the row has no answer yet.
func (r Record) InProgress() bool { return r.Answer == nil }

// Token is a random 16-byte identifier, drawn by a claim. It serves twice:
//
//   - as the owner token of an attempt (Record.Owner): only the owner
//     completes or releases the row it claimed, and [Guard.Settle] and
//     [Guard.Release] act only on the attempt whose owner they name;
//   - as the intent of a key (Record.Intent): what a client meant by
//     sending it. The first claim of a key draws it and the key's row
//     keeps it, so the work ([ExecutionFromContext]), every retry that finds
//     the row, and a reconciler looking at it later (reconcile.Item.Intent)
//     all see the same one. A key released because nothing happened keeps
//     its intent: the next claim is another attempt of the same intent (see
//     [Execution.Attempt]). Only a key claimed again after it expired is a
//     new intent with a new Token.
//
// Name what the work creates after its intent (DeriveID): a retry after a
// release, even a wrong one, then meets the same order and the provider's own
// idempotency under the same key (DownstreamKey), not a second charge; and a
// key reused after expiry creates a new order, not the old order's replay.
//
// The zero Token is never a valid one.
type Token [16]byte

// String returns the token as 26 lowercase base32 characters.
func (t Token) String() string {
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(t[:]))
}

// Equal reports whether r and o replay the same: same status, same body,
// and the same values for every header (a nil and an empty Header, Body or
// value list are the same, as they are once stored).
func (r Response) Equal(o Response) bool {
	if r.Status != o.Status || !bytes.Equal(r.Body, o.Body) {
		return false
	}
	return sameHeaders(r.Header, o.Header) && sameHeaders(o.Header, r.Header)
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

// Errors returned by a Store. Compare with errors.Is: a store wraps them with
// the operation and the cause.
var (
	// ErrNotFound: no live (unexpired, unreleased) row for that scope and
	// key.
	ErrNotFound = errors.New("idem: not found")
	// ErrNotOwner: the live row for that scope and key was claimed under
	// another owner token.
	ErrNotOwner = errors.New("idem: not the owner of an in-progress row")
	// ErrCompleted: the live row for that scope and key already has an
	// answer, so it can no longer be completed, settled or released.
	ErrCompleted = errors.New("idem: row already has an answer")
	// ErrExists: a write hit the unique constraint on (scope, key). A
	// store's own calls never return it; it comes from a caller's SQL
	// through a shared transaction.
	ErrExists = errors.New("idem: row exists")
	// ErrInvalid: the store refused an argument (e.g. a NUL byte in a text
	// column, an out-of-range status). Nothing was written.
	ErrInvalid = errors.New("idem: invalid argument")
)
