package idem

// Names and limits: the headers, problem types, defaults and instrument
// names idem uses, and the sizes a Request's fields may have.
const (
	// HeaderKey is the request header that carries the idempotency key, as
	// named by the IETF draft "The Idempotency-Key HTTP Header Field".
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed is set to "true" on every replayed answer.
	HeaderReplayed = "Idempotent-Replayed"
	// DefaultProblemBase prefixes the type URI of every problem the
	// middleware sends unless MiddlewareConfig.ProblemBase says otherwise.
	// Each type is documented under its slug in docs/problems.md.
	DefaultProblemBase = "https://github.com/idemguard/idem/blob/main/docs/problems.md#"
	// DefaultMaxRequestBody is the default of MiddlewareConfig.MaxRequestBody.
	DefaultMaxRequestBody = 1 << 20 // 1 MiB
	// DefaultMaxResponseBody is the default of MiddlewareConfig.MaxResponseBody.
	DefaultMaxResponseBody = 1 << 20 // 1 MiB
	// MetricEvents is the counter of the guard's events; attribute "event":
	// executed, replayed, in_progress, ... (see Config.MeterProvider).
	MetricEvents = "idem.events"
	// MetricPhase is the histogram, in seconds, of the guard's own steps;
	// attribute "phase": lock, claim, read, store, lease.
	MetricPhase = "idem.phase.duration"
	// MaxKeyLen is the longest Request.Key, in bytes.
	MaxKeyLen = 255
	// MaxScopeLen is the longest Request.Scope, in bytes.
	MaxScopeLen = 1024

	// Problem type slugs. A problem's Type is the configured base followed
	// by one of these; they are stable and clients may switch on them.

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
