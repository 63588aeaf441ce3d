package grpcidem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/idemclient"
	"github.com/idemguard/idem/internal/retry"
)

// ClientConfig tunes UnaryClientInterceptor. A nil *ClientConfig is valid:
// every default.
type ClientConfig struct {
	// Methods reports, given the full method name, which calls are
	// guarded; others pass through untouched, once. Defaults to every
	// unary method.
	Methods func(fullMethod string) bool
	// Retry bounds and paces the retries, with the meaning and defaults of
	// idemclient's: 5 attempts within 30s, the server's RetryInfo delay or
	// a full-jitter backoff from 200ms to 5s.
	Retry idemclient.Retry
}

// ErrKeyInvalid is the client interceptor's error, nothing sent, for a call
// whose outgoing metadata carries a key the server would refuse: more than
// one value, empty, over 255 characters, a comma, a leading or trailing
// space, not printable ASCII. The returned error wraps it with the reason.
var ErrKeyInvalid = errors.New("grpcidem: idempotency key invalid")

// WithResult is a call option that makes the client interceptor fill r
// when the call returns, with or without an error: the key every attempt
// carried, whether the answer is a replay (header "idempotent-replayed:
// true") and how many attempts were sent. On a call that is not guarded it
// is ignored.
func WithResult(r *idemclient.Result) grpc.CallOption { return resultOption{r: r} }

type resultOption struct {
	grpc.EmptyCallOption
	r *idemclient.Result
}

// UnaryClientInterceptor returns a gRPC unary client interceptor that sends
// every attempt of a guarded call with one idempotency key and the same
// request message, and retries the refusals after which the same call may
// succeed. It is safe for concurrent use; install it with
// grpc.WithChainUnaryInterceptor.
//
// A call whose outgoing metadata has no key gets a new random one
// (idemclient.NewKey), set once for every attempt; a caller's own key (born
// with the intent: metadata.AppendToOutgoingContext(ctx, "idempotency-key",
// key)) is checked against the server's rules first, and an invalid one
// fails with ErrKeyInvalid, nothing sent.
//
// It mirrors what the server interceptor sends:
//
//	Status                                             Retried
//	Unavailable (SERVICE_UNAVAILABLE, or no connection) yes, after its RetryInfo if any
//	Aborted REQUEST_IN_PROGRESS, REQUEST_PENDING       yes, after its RetryInfo
//	a replay (header idempotent-replayed: true)        no: it is the stored answer
//	FailedPrecondition IDEMPOTENCY_KEY_REUSED,         no
//	  InvalidArgument IDEMPOTENCY_KEY_INVALID, any
//	  other code, OK
//
// The wait and the bounds are idemclient's (ClientConfig.Retry). When
// MaxAttempts or MaxElapsed ends the retries, the call returns the last
// status. When the call's context ends, or a retry would start after its
// deadline (then it returns at once), the error has the context's code
// (DeadlineExceeded, Canceled), wraps the context's error
// (errors.Is(err, context.DeadlineExceeded)) and names the last status; the
// outcome is unknown, and the call may be sent again later with the same key
// (WithResult tells it).
//
// UnaryClientInterceptor panics when a Retry field is invalid, naming it.
func UnaryClientInterceptor(cfg *ClientConfig) grpc.UnaryClientInterceptor {
	return newClientInterceptor(cfg, retry.RealClock)
}

type clientInterceptor struct {
	match  func(string) bool
	policy retry.Policy
	clock  retry.Clock
}

func newClientInterceptor(cfg *ClientConfig, clock retry.Clock) grpc.UnaryClientInterceptor {
	var c ClientConfig
	if cfg != nil {
		c = *cfg
	}
	p, err := retry.Policy(c.Retry).WithDefaults("ClientConfig.Retry")
	if err != nil {
		panic("grpcidem: " + err.Error())
	}
	ci := &clientInterceptor{match: c.Methods, policy: p, clock: clock}
	return ci.intercept
}

func (ci *clientInterceptor) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if ci.match != nil && !ci.match(method) {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	res := &idemclient.Result{}
	for _, o := range opts {
		if ro, ok := o.(resultOption); ok && ro.r != nil {
			res = ro.r
		}
	}
	*res = idemclient.Result{}
	md, _ := metadata.FromOutgoingContext(ctx)
	var key string
	if values := md.Get(MetadataKey); len(values) > 0 {
		k, err := parseKey(values)
		if err != nil {
			reason := err.Error()
			if ke := (*idem.KeyError)(nil); errors.As(err, &ke) {
				reason = ke.Reason
			}
			return fmt.Errorf("%w: %s", ErrKeyInvalid, reason)
		}
		key = k
	} else {
		key = idemclient.NewKey()
		ctx = metadata.AppendToOutgoingContext(ctx, MetadataKey, key)
	}
	res.Key = key

	var hdr metadata.MD
	opts = append(opts[:len(opts):len(opts)], grpc.Header(&hdr))
	call := retry.Start(ci.policy, ci.clock)
	for {
		hdr = nil
		res.Attempts = call.Attempts()
		err := invoker(ctx, method, req, reply, cc, opts...)
		res.Replayed = len(hdr.Get(MetadataReplayed)) == 1 && hdr.Get(MetadataReplayed)[0] == "true"
		if err == nil || res.Replayed {
			return err
		}
		if cerr := retry.Ended(ctx); cerr != nil {
			return gaveUp(res.Attempts, cerr, err)
		}
		again, hint := retryable(err)
		if !again {
			return err
		}
		if _, werr := call.Wait(ctx, hint); werr != nil {
			if errors.Is(werr, retry.ErrExhausted) {
				return err
			}
			return gaveUp(res.Attempts, werr, err)
		}
	}
}

// retryable reports whether a call that failed with err may be sent again
// with the same key, and the server's RetryInfo delay (0 without one).
func retryable(err error) (bool, time.Duration) {
	st := status.Convert(err)
	var reason string
	var delay time.Duration
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == ErrorDomain {
				reason = d.GetReason()
			}
		case *errdetails.RetryInfo:
			delay = d.GetRetryDelay().AsDuration()
		}
	}
	switch {
	case st.Code() == codes.Unavailable:
	case st.Code() == codes.Aborted && (reason == ReasonInProgress || reason == ReasonPending):
	default:
		return false, 0
	}
	return true, delay
}

// clientError is the error of a call whose retries the context ended: its
// status has the context's code, and it wraps the context's error and the
// last attempt's.
type clientError struct {
	code codes.Code
	err  error
}

func gaveUp(attempts int, cause, last error) error {
	plural := "s"
	if attempts == 1 {
		plural = ""
	}
	return &clientError{code: status.FromContextError(cause).Code(),
		err: fmt.Errorf("grpcidem: no final answer after %d attempt%s: %w; the last: %w", attempts, plural, cause, last)}
}

func (e *clientError) Error() string { return e.err.Error() }

func (e *clientError) Unwrap() error { return e.err }

// GRPCStatus makes status.Code(err) the context's code, not the last
// attempt's.
func (e *clientError) GRPCStatus() *status.Status { return status.New(e.code, e.err.Error()) }
