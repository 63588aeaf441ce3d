package idem

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// Problem is an RFC 9457 Problem Details object. Only Type, Title, Status and
// Detail are rendered; Detail is written for the client and never holds
// internal error text.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Slug is the type's stable slug (ProblemInProgress, ...), for renderers
	// that map problems to their own catalogue.
	Slug string `json:"-"`
	// RetryAfter, when positive, is sent as the Retry-After header in whole
	// seconds, rounded up.
	RetryAfter time.Duration `json:"-"`
	// Err is the internal cause, for logging. Never rendered.
	Err error `json:"-"`
}

// Write writes p to w: application/problem+json with Cache-Control: no-store,
// and Retry-After when the problem asks for it. It is how the middleware
// renders problems unless MiddlewareConfig.RenderProblem says otherwise.
func (p Problem) Write(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if p.RetryAfter > 0 {
		secs := int64((p.RetryAfter + time.Second - 1) / time.Second)
		h.Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	body, err := json.Marshal(p)
	if err != nil { // only plain strings and an int: cannot happen
		body = []byte(`{"status":500}`)
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}

var problemTitles = map[string]string{
	ProblemKeyMissing:            "Idempotency-Key header required",
	ProblemKeyInvalid:            "Idempotency-Key header invalid",
	ProblemKeyReused:             "Idempotency key reused with a different request",
	ProblemInProgress:            "A request with this idempotency key is in progress",
	ProblemPending:               "The outcome of this idempotency key's request is not known yet",
	ProblemUnauthenticated:       "Authentication required",
	ProblemAuthorizationRepeated: "Authorization header repeated",
	ProblemBodyTooLarge:          "Request body too large",
	ProblemBodyInvalid:           "Request body could not be read",
	ProblemServiceUnavailable:    "Service temporarily unavailable",
}
