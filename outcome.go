package idem

import (
	"errors"
	"fmt"
)

// Outcome says what the guard decided for one request.
type Outcome int

const (
	// OutcomeNone: nothing was decided and the work did not run (the request
	// was invalid or the store could not be reached). Do's error says why.
	OutcomeNone Outcome = iota
	// OutcomeExecuted: the work ran and its answer is stored; every retry
	// with the same key and fingerprint is replayed this answer.
	OutcomeExecuted
	// OutcomeExecutedUnstored: the work ran but its answer is not stored: it
	// was a 5xx or an error ("we don't know yet"), or storing it failed. The
	// key stays in progress, so retries get ErrInProgress, then ErrPending
	// once it waits for reconciliation, until the key is settled
	// ([Guard.Settle]) or released ([Guard.Release]); it never expires
	// meanwhile. ("Pending" always means that wait, never this outcome.)
	OutcomeExecutedUnstored
	// OutcomeExecutedReleased: the work ran and declared that nothing
	// happened (a 429, [MarkRetrySafe], or an error wrapping [ErrRetrySafe]);
	// the key was released and the next retry runs the work again.
	OutcomeExecutedReleased
	// OutcomeReplayed: an earlier execution's stored answer was returned and
	// the work did not run.
	OutcomeReplayed
	// OutcomeInProgress: another execution of the key is running or its answer
	// is unknown; the work did not run. Do returns ErrInProgress, or
	// ErrPending when the key waits for reconciliation.
	OutcomeInProgress
	// OutcomeKeyReused: the key was used before with a different fingerprint;
	// the work did not run. Do returns ErrKeyReused.
	OutcomeKeyReused
)

var outcomeNames = [...]string{
	OutcomeNone:             "none",
	OutcomeExecuted:         "executed",
	OutcomeExecutedUnstored: "executed_unstored",
	OutcomeExecutedReleased: "executed_released",
	OutcomeReplayed:         "replayed",
	OutcomeInProgress:       "in_progress",
	OutcomeKeyReused:        "key_reused",
}

// String returns a stable snake_case name, suitable as a metric attribute.
func (o Outcome) String() string {
	if o >= 0 && int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", int(o))
}

// Executed reports whether the work ran for this request.
func (o Outcome) Executed() bool {
	return o == OutcomeExecuted || o == OutcomeExecutedUnstored || o == OutcomeExecutedReleased
}

// Errors returned by Guard.Do, Complete and ParseKey. Compare with
// errors.Is; returned errors may wrap them with a cause.
var (
	// ErrInProgress: the key is claimed and has no answer yet (HTTP 409 with
	// Retry-After). The work did not run. ErrPending is a kind of it.
	ErrInProgress = errors.New("idem: request in progress")
	// ErrPending: the key's work ran longer ago than the Guard's MaxHold
	// without a stored answer (a 5xx, a crash, an answer that could not be
	// written): it waits for reconciliation, which can take minutes (HTTP
	// 409, problem request-pending). errors.Is(ErrPending, ErrInProgress)
	// is true, so code that handles ErrInProgress handles it too.
	ErrPending error = pendingError{}
	// ErrKeyReused: the key was first used with a different request (HTTP 422).
	// The work did not run and the stored answer is not revealed.
	ErrKeyReused = errors.New("idem: idempotency key reused with a different request")
	// ErrUnavailable: the store could not decide (PostgreSQL unreachable,
	// timed out). The guard fails closed: the work did not run (HTTP 503).
	ErrUnavailable = errors.New("idem: store unavailable")
	// ErrInvalidRequest: the Request's scope, key or fingerprint is unusable.
	// The error is a *RequestError naming the field.
	ErrInvalidRequest = errors.New("idem: invalid request")
	// ErrRetrySafe can be returned (or wrapped) by the work to declare that it
	// did nothing that a retry could repeat; the key is released.
	ErrRetrySafe = errors.New("idem: nothing happened, retry is safe")

	// Errors of Complete.

	// ErrNotGuarded: the context does not belong to a guarded execution.
	ErrNotGuarded = errors.New("idem: context does not belong to a guarded execution")
	// ErrJoinUnsupported: the Guard's store cannot write through a caller's
	// transaction (it is not a [Joiner]).
	ErrJoinUnsupported = errors.New("idem: store cannot join a transaction")
	// ErrSuperseded: the key no longer takes this execution's answer: its
	// claim was released, settled or taken over while the work ran (only
	// work that overran the Guard's MaxHold, or a hand-made release, allows
	// it), or this execution already committed another answer. Roll back
	// and answer 409: the client's retry gets the stored answer.
	ErrSuperseded = errors.New("idem: the key no longer takes this execution's answer")

	// Errors of ParseKey; an invalid key is a *KeyError.

	// ErrKeyMissing: the request has no Idempotency-Key header.
	ErrKeyMissing = errors.New("idem: Idempotency-Key header missing")
	// ErrKeyInvalid: the header is present but unusable. The error is a
	// *KeyError saying why.
	ErrKeyInvalid = errors.New("idem: Idempotency-Key header invalid")
)

type pendingError struct{}

func (pendingError) Error() string        { return "idem: request pending reconciliation" }
func (pendingError) Is(target error) bool { return target == ErrInProgress }

// RequestError describes why a Request was refused before anything ran.
type RequestError struct {
	Field  string // "Scope", "Key", "Fingerprint", or "Request" when the store refused it
	Reason string
}

func (e *RequestError) Error() string {
	return "idem: invalid request: " + e.Field + ": " + e.Reason
}

// Is makes errors.Is(err, ErrInvalidRequest) true.
func (e *RequestError) Is(target error) bool { return target == ErrInvalidRequest }
