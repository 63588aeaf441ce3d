package idem

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// DefaultProblemBase prefixes the type URI of every problem the middleware
// sends unless WithProblemBase says otherwise. Each type is documented under
// its slug in docs/problems.md.
const DefaultProblemBase = "https://github.com/idemguard/idem/blob/main/docs/problems.md#"

// Problem type slugs. A problem's Type is the configured base followed by one
// of these; they are stable and clients may switch on them.
const (
	ProblemKeyMissing            = "idempotency-key-missing" // 400
	ProblemKeyInvalid            = "idempotency-key-invalid" // 400
	ProblemKeyReused             = "idempotency-key-reused"  // 422
	ProblemInProgress            = "request-in-progress"     // 409, Retry-After (RetryHints.InProgress)
	ProblemPending               = "request-pending"         // 409, Retry-After (RetryHints.Pending)
	ProblemUnauthenticated       = "unauthenticated"         // 401 (configurable)
	ProblemAuthorizationRepeated = "authorization-repeated"  // 400: two Authorization fields
	ProblemBodyTooLarge          = "request-body-too-large"  // 413
	ProblemBodyInvalid           = "request-body-invalid"    // 400
	ProblemServiceUnavailable    = "service-unavailable"     // 503, Retry-After (RetryHints.Unavailable)
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

// ProblemRenderer writes a problem to the client. Replace it with
// WithProblemRenderer to change the format; it must write a complete
// response.
type ProblemRenderer func(w http.ResponseWriter, r *http.Request, p Problem)

// RenderProblem is the default ProblemRenderer: application/problem+json with
// Cache-Control: no-store, and Retry-After when the problem asks for it.
func RenderProblem(w http.ResponseWriter, _ *http.Request, p Problem) {
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
