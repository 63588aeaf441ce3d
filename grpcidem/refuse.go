package grpcidem

import (
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemguard/idem"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo detail attached to
// every refusal of the interceptor.
const ErrorDomain = "idem.idemguard.github.com"

// Reasons of the google.rpc.ErrorInfo detail attached to every refusal: the
// stable, machine-readable name of what happened (the gRPC counterpart of
// the HTTP middleware's problem types). Clients compare these, never the
// message text.
const (
	ReasonInProgress      = "REQUEST_IN_PROGRESS"     // codes.Aborted, with RetryInfo
	ReasonPending         = "REQUEST_PENDING"         // codes.Aborted, with RetryInfo
	ReasonKeyReused       = "IDEMPOTENCY_KEY_REUSED"  // codes.FailedPrecondition
	ReasonKeyMissing      = "IDEMPOTENCY_KEY_MISSING" // codes.InvalidArgument
	ReasonKeyInvalid      = "IDEMPOTENCY_KEY_INVALID" // codes.InvalidArgument
	ReasonUnauthenticated = "UNAUTHENTICATED"         // codes.Unauthenticated
	ReasonUnavailable     = "SERVICE_UNAVAILABLE"     // codes.Unavailable, with RetryInfo
)

// refusals are the gRPC form of each refusal idem.Classify names (its
// Slug): the code follows the kind of refusal, not its HTTP status (see the
// package documentation for why each one). The messages of the key's
// refusals name the metadata entry and are written by refuse.
var refusals = map[string]struct {
	code        codes.Code
	reason, msg string
}{
	idem.ProblemInProgress: {codes.Aborted, ReasonInProgress,
		"A request with this idempotency key is being processed. Retry shortly with the same key."},
	idem.ProblemPending: {codes.Aborted, ReasonPending,
		"The outcome of the request with this idempotency key is not known yet; it is being reconciled. Retry later with the same key."},
	idem.ProblemKeyReused: {codes.FailedPrecondition, ReasonKeyReused,
		"This idempotency key was used with a different request. Use a new key for a new intent."},
	idem.ProblemKeyMissing: {codes.InvalidArgument, ReasonKeyMissing, ""},
	idem.ProblemKeyInvalid: {codes.InvalidArgument, ReasonKeyInvalid, ""},
	idem.ProblemUnauthenticated: {codes.Unauthenticated, ReasonUnauthenticated,
		"This request needs an authenticated caller."},
	idem.ProblemServiceUnavailable: {codes.Unavailable, ReasonUnavailable,
		"The request was not processed. Retry later with the same idempotency key."},
}

// refusal is the error a client gets when the handler did not run: a status
// with an ErrorInfo detail naming the reason and, when retry is positive, a
// RetryInfo detail saying when to retry.
func refusal(code codes.Code, reason, msg string, retry time.Duration, meta map[string]string) error {
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain, Metadata: meta}}
	if retry > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	}
	st := status.New(code, msg)
	if withDetails, err := st.WithDetails(details...); err == nil { // fails only for codes.OK
		st = withDetails
	}
	return st.Err()
}
