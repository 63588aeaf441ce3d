package idem

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"
)

// Request names one intent: who asks (Scope), under which idempotency key,
// and what they sent (Fingerprint).
type Request struct {
	// Scope is the authenticated caller, e.g. the user id. Keys are unique per
	// scope: another scope's key is a key nobody has seen. Required: 1 to
	// 1024 bytes of valid UTF-8 without NUL.
	Scope string
	// Key is the client's idempotency key. Required: 1 to 255 bytes of valid
	// UTF-8 without NUL (the middleware further restricts it to printable
	// ASCII).
	Key string
	// Fingerprint identifies the request's content (see HashRequest). A retry
	// must send the same one. The zero Fingerprint is refused.
	Fingerprint Fingerprint
}

func (r Request) validate() error {
	if err := validText(r.Scope, MaxScopeLen); err != "" {
		return &RequestError{Field: "Scope", Reason: err}
	}
	if err := validText(r.Key, MaxKeyLen); err != "" {
		return &RequestError{Field: "Key", Reason: err}
	}
	if r.Fingerprint == (Fingerprint{}) {
		return &RequestError{Field: "Fingerprint", Reason: "zero"}
	}
	return nil
}

func validText(s string, max int) string {
	switch {
	case s == "":
		return "empty"
	case len(s) > max:
		return fmt.Sprintf("longer than %d bytes", max)
	case !utf8.ValidString(s):
		return "not valid UTF-8"
	}
	if strings.IndexByte(s, 0) >= 0 {
		return "contains NUL"
	}
	return ""
}

// Response is a finished answer: what is stored and replayed. Header holds
// only what the caller chose to keep (the middleware keeps an allowlist).
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Work is the guarded operation. Its ctx carries the execution (see
// [ExecutionFromContext], [MarkRetrySafe], [Complete]) and a deadline
// WorkTimeout after the claim. The returned Response decides what happens to
// the key:
//
//   - status 100-499 except 429: stored and replayed to every retry;
//   - 429, an error wrapping ErrRetrySafe, or MarkRetrySafe called: the key is
//     released, the next retry runs the work again;
//   - 5xx or any other error: not stored, the key stays in progress until it
//     is settled or released (it never expires meanwhile).
type Work func(ctx context.Context) (Response, error)

// MarkRetrySafe declares, from inside the work (ctx is the work's context or
// one derived from it), that the work did nothing a retry could repeat, for
// example a 503 from an open circuit breaker before any charge. Whatever
// status the work then returns, or if it then panics, the key is released
// instead of stored or left in progress, and the next retry runs. It reports
// false, and does nothing, when ctx does not belong to a guarded execution.
// An answer already committed through [Complete] is kept all the same.
func MarkRetrySafe(ctx context.Context) bool {
	x := executionFrom(ctx)
	if x == nil {
		return false
	}
	x.retrySafe.Store(true)
	return true
}

// Execution is what a guarded execution knows of itself: its Request, its
// intent and which attempt of the intent it is.
type Execution struct {
	// Request is the Request being executed.
	Request Request
	// Intent is the key's intent (see [Token]). Handlers derive the
	// identifiers of what they create from it with DeriveID; it is the same
	// in every attempt of the intent.
	Intent Token
	// Attempt is which attempt of its intent the execution is: 1 for the
	// first claim of the key, then one more after each release (the work
	// returned 429 or ErrRetrySafe, called MarkRetrySafe, or a reconciler
	// found that nothing happened). A reconciler sees the same number
	// (reconcile.Item.Attempt).
	//
	// Most providers should see one key per intent, the same in every
	// attempt (DownstreamKey over a DeriveID of the intent), so that a
	// release made in error meets their idempotency instead of charging
	// twice. A provider that stores an error answer under its key (and
	// replays it to every retry of the key) needs a fresh key per attempt
	// instead: derive it from the attempt too, for example
	//
	//	x := idem.ExecutionFromContext(ctx)
	//	id := idem.DeriveID("ch_", "charge/"+strconv.Itoa(x.Attempt), x.Intent)
	//
	// and have the reconciler look up every attempt up to Item.Attempt.
	Attempt int
}

// ExecutionFromContext returns the guarded execution that ctx belongs to
// (the work's context, or the request context a guarded HTTP handler
// receives), or the zero Execution (Attempt 0, the zero Token) when ctx
// belongs to none.
func ExecutionFromContext(ctx context.Context) Execution {
	x := executionFrom(ctx)
	if x == nil {
		return Execution{}
	}
	return Execution{Request: x.req, Intent: x.intent, Attempt: x.attempt}
}
