package idem

import (
	"errors"
	"math/rand/v2"
	"net/http"
	"time"
)

// Decision is what one result of the guard means to the client that sent the
// request, whatever carries it (HTTP, gRPC, a queue): answered or refused,
// which refusal, its HTTP status, and when to try again. [Classify] makes it;
// the HTTP middleware and grpcidem's interceptor both refuse through it, so
// every transport refuses the same requests the same way. The zero Decision
// means answered.
type Decision struct {
	// Slug names the refusal: ProblemInProgress, ProblemPending,
	// ProblemKeyReused, ProblemKeyMissing, ProblemKeyInvalid,
	// ProblemUnauthenticated or ProblemServiceUnavailable, the stable slugs
	// of docs/problems.md. It is "" when the request was answered: the work
	// ran (Outcome.Executed; its own result goes back) or a stored answer is
	// replayed.
	Slug string
	// Status is the refusal's HTTP status: 409, 422, 400, 401 or 503. It is 0
	// when the request was answered: the answer carries its own.
	Status int
	// RetryAfter is how long the client should wait before it sends the
	// request again with the same key, in whole seconds: from 1s to 2s for
	// ProblemInProgress (the first request's answer is typically a work's
	// duration away), 30s to 36s for ProblemPending (the reconciler's pace:
	// it acts on a key about a minute after its work ended) and 2s to 3s
	// for ProblemServiceUnavailable. The spread is a random jitter of whole
	// seconds, up to a fifth of the base (at least 1s), so that the clients
	// refused together do not all return in the same second. It is 0 for
	// the other refusals, which sending the same request again cannot
	// change, and after an answer.
	RetryAfter time.Duration
}

// Classify returns what Guard.Do's outcome and error mean to the client. It
// also classifies, with OutcomeNone, the errors a transport meets before it
// calls Do: ParseKey's (ErrKeyMissing, a *KeyError) and a *RequestError
// whose Field is "Scope" for a request without a usable caller.
//
//	outcome                  err                                   Slug                       Status  RetryAfter
//	Executed, Replayed,      any                                   ""                         0       0
//	  ExecutedUnstored,
//	  ExecutedReleased
//	InProgress               ErrInProgress                         ProblemInProgress          409     1s+
//	InProgress               ErrPending                            ProblemPending             409     30s+
//	KeyReused                ErrKeyReused                          ProblemKeyReused           422     0
//	None                     ErrKeyMissing                         ProblemKeyMissing          400     0
//	None                     ErrKeyInvalid, or ErrInvalidRequest   ProblemKeyInvalid          400     0
//	None                     *RequestError for Field "Scope"       ProblemUnauthenticated     401     0
//	None                     anything else (ErrUnavailable, ctx)   ProblemServiceUnavailable  503     2s+
//
// The work never ran when Slug is set: retrying with the same key is safe.
// Classify is a pure function apart from the jitter's random draw, and safe
// for concurrent use.
func Classify(outcome Outcome, err error) Decision {
	var re *RequestError
	switch {
	case outcome.Executed() || outcome == OutcomeReplayed:
		return Decision{}
	case outcome == OutcomeInProgress && errors.Is(err, ErrPending):
		return Decision{Slug: ProblemPending, Status: http.StatusConflict, RetryAfter: jitter(retryPending)}
	case outcome == OutcomeInProgress:
		return Decision{Slug: ProblemInProgress, Status: http.StatusConflict, RetryAfter: jitter(retryInProgress)}
	case outcome == OutcomeKeyReused:
		return Decision{Slug: ProblemKeyReused, Status: http.StatusUnprocessableEntity}
	case errors.Is(err, ErrKeyMissing):
		return Decision{Slug: ProblemKeyMissing, Status: http.StatusBadRequest}
	case errors.As(err, &re) && re.Field == "Scope":
		return Decision{Slug: ProblemUnauthenticated, Status: http.StatusUnauthorized}
	case errors.Is(err, ErrKeyInvalid) || errors.Is(err, ErrInvalidRequest):
		return Decision{Slug: ProblemKeyInvalid, Status: http.StatusBadRequest}
	}
	return Decision{Slug: ProblemServiceUnavailable, Status: http.StatusServiceUnavailable, RetryAfter: jitter(retryUnavailable)}
}

// The Retry-After of each refusal after which the same request may succeed,
// before the jitter (see Decision.RetryAfter).
const (
	retryInProgress  = time.Second
	retryPending     = 30 * time.Second
	retryUnavailable = 2 * time.Second
)

// jitter returns the Retry-After to send for the base d: d rounded up to
// whole seconds, plus a random whole number of seconds from 0 to max(1s,
// d/5).
func jitter(d time.Duration) time.Duration {
	secs := int64((d + time.Second - 1) / time.Second)
	spread := (secs + 4) / 5 // a fifth, rounded up: at least 1
	return time.Duration(secs+rand.Int64N(spread+1)) * time.Second
}
