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
	// request again with the same key: the refusal's RetryHints value with
	// its jitter, in whole seconds, for ProblemInProgress, ProblemPending and
	// ProblemServiceUnavailable. It is 0 for the other refusals, which
	// sending the same request again cannot change, after an answer, and
	// when the hint is negative.
	RetryAfter time.Duration
}

// Classify returns what Guard.Do's outcome and error mean to the client,
// given the Retry-After hints (the zero RetryHints gives every default). It
// also classifies, with OutcomeNone, the errors a transport meets before it
// calls Do: ParseKey's (ErrKeyMissing, a *KeyError) and a *RequestError
// whose Field is "Scope" for a request without a usable caller.
//
//	outcome                  err                                   Slug                       Status  RetryAfter
//	Executed, Replayed,      any                                   ""                         0       0
//	  ExecutedUnstored,
//	  ExecutedReleased
//	InProgress               ErrInProgress                         ProblemInProgress          409     hints.InProgress
//	InProgress               ErrPending                            ProblemPending             409     hints.Pending
//	KeyReused                ErrKeyReused                          ProblemKeyReused           422     0
//	None                     ErrKeyMissing                         ProblemKeyMissing          400     0
//	None                     ErrKeyInvalid, or ErrInvalidRequest   ProblemKeyInvalid          400     0
//	None                     *RequestError for Field "Scope"       ProblemUnauthenticated     401     0
//	None                     anything else (ErrUnavailable, ctx)   ProblemServiceUnavailable  503     hints.Unavailable
//
// The work never ran when Slug is set: retrying with the same key is safe.
// Classify is a pure function apart from the jitter's random draw, and safe
// for concurrent use.
func Classify(outcome Outcome, err error, hints RetryHints) Decision {
	h := hints.withDefaults()
	var re *RequestError
	switch {
	case outcome.Executed() || outcome == OutcomeReplayed:
		return Decision{}
	case outcome == OutcomeInProgress && errors.Is(err, ErrPending):
		return Decision{Slug: ProblemPending, Status: http.StatusConflict, RetryAfter: retryAfter(h.Pending)}
	case outcome == OutcomeInProgress:
		return Decision{Slug: ProblemInProgress, Status: http.StatusConflict, RetryAfter: retryAfter(h.InProgress)}
	case outcome == OutcomeKeyReused:
		return Decision{Slug: ProblemKeyReused, Status: http.StatusUnprocessableEntity}
	case errors.Is(err, ErrKeyMissing):
		return Decision{Slug: ProblemKeyMissing, Status: http.StatusBadRequest}
	case errors.As(err, &re) && re.Field == "Scope":
		return Decision{Slug: ProblemUnauthenticated, Status: http.StatusUnauthorized}
	case errors.Is(err, ErrKeyInvalid) || errors.Is(err, ErrInvalidRequest):
		return Decision{Slug: ProblemKeyInvalid, Status: http.StatusBadRequest}
	}
	return Decision{Slug: ProblemServiceUnavailable, Status: http.StatusServiceUnavailable, RetryAfter: retryAfter(h.Unavailable)}
}

// RetryHints are the Retry-After values of the refusals after which the same
// request may succeed (Classify's RetryAfter), rounded up to whole seconds.
// The HTTP middleware sends them as Retry-After, grpcidem as RetryInfo. A
// zero field takes its default; a negative one sends no Retry-After.
//
// Each refusal adds a random jitter of whole seconds to its hint, from 0 up
// to a fifth of the hint (at least 1s), so that the clients refused together
// do not all return in the same second: a hint h is sent as a value from h to
// h + max(1s, h/5), never below 1s.
type RetryHints struct {
	// InProgress: a request with the key is running now; its answer is
	// typically a work's duration away. Defaults to 1s.
	InProgress time.Duration
	// Pending: the key's work ended without a known outcome and waits for
	// reconciliation (ErrPending), typically the reconciler's MinAge plus
	// an interval away. Defaults to 30s.
	Pending time.Duration
	// Unavailable: the store could not decide (503); nothing ran.
	// Defaults to 2s.
	Unavailable time.Duration
}

// The defaults of RetryHints.
const (
	defaultRetryInProgress  = time.Second
	defaultRetryPending     = 30 * time.Second
	defaultRetryUnavailable = 2 * time.Second
)

func (h RetryHints) withDefaults() RetryHints {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&h.InProgress, defaultRetryInProgress)
	def(&h.Pending, defaultRetryPending)
	def(&h.Unavailable, defaultRetryUnavailable)
	return h
}

// retryAfter is the jittered hint d, or 0 when d is negative.
func retryAfter(d time.Duration) time.Duration { return max(0, jitter(d)) }

// jitter returns the Retry-After to send for the hint d (RetryHints): d
// rounded up to whole seconds, at least 1s, plus a random whole number of
// seconds from 0 to max(1s, d/5). A hint that is not positive stays as it
// is: no Retry-After.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	secs := int64((d + time.Second - 1) / time.Second)
	spread := (secs + 4) / 5 // a fifth, rounded up: at least 1
	return time.Duration(secs+rand.Int64N(spread+1)) * time.Second
}
