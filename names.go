package idem

// Names and limits: the headers, problem types, defaults and instrument
// names idem uses, and the sizes a Request's fields may have.
const (
	// HeaderKey is the request header that carries the idempotency key, as
	// named by the IETF draft "The Idempotency-Key HTTP Header Field".
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed is set to "true" on every replayed answer.
	HeaderReplayed = "Idempotent-Replayed"
	// ProblemBase prefixes the type URI of every problem the middleware
	// sends (a MiddlewareConfig.RenderProblem may write another). Each type
	// is documented under its slug in docs/problems.md.
	ProblemBase = "https://github.com/idemguard/idem/blob/main/docs/problems.md#"
	// DefaultMaxBody is the default of MiddlewareConfig.MaxBody.
	DefaultMaxBody = 1 << 20 // 1 MiB
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

	// Problem type slugs. A problem's Type is ProblemBase followed by one
	// of these; they are stable and clients may switch on them.

	ProblemKeyMissing            = "idempotency-key-missing" // 400
	ProblemKeyInvalid            = "idempotency-key-invalid" // 400
	ProblemKeyReused             = "idempotency-key-reused"  // 422
	ProblemInProgress            = "request-in-progress"     // 409, Retry-After
	ProblemPending               = "request-pending"         // 409, Retry-After
	ProblemUnauthenticated       = "unauthenticated"         // 401
	ProblemAuthorizationRepeated = "authorization-repeated"  // 400: two Authorization fields
	ProblemBodyTooLarge          = "request-body-too-large"  // 413
	ProblemBodyInvalid           = "request-body-invalid"    // 400
	ProblemServiceUnavailable    = "service-unavailable"     // 503, Retry-After
)
