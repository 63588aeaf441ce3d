package grpcidem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemguard/idem"
)

// The interceptor refuses as idem.Classify decides: for every refusal the
// guard (or the key's parsing, or a missing caller) can give, the gRPC code
// and ErrorInfo reason are those of Classify's kind, and RetryInfo is sent
// exactly when Classify gives a RetryAfter, drawn from the same hint.
func TestInterceptorAgreesWithClassify(t *testing.T) {
	cause := errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	// What each kind of refusal is in gRPC, written out independently of
	// refusals: the code follows the kind, never the HTTP status.
	want := map[string]struct {
		code   codes.Code
		reason string
	}{
		idem.ProblemInProgress:         {codes.Aborted, ReasonInProgress},
		idem.ProblemPending:            {codes.Aborted, ReasonPending},
		idem.ProblemKeyReused:          {codes.FailedPrecondition, ReasonKeyReused},
		idem.ProblemKeyMissing:         {codes.InvalidArgument, ReasonKeyMissing},
		idem.ProblemKeyInvalid:         {codes.InvalidArgument, ReasonKeyInvalid},
		idem.ProblemUnauthenticated:    {codes.Unauthenticated, ReasonUnauthenticated},
		idem.ProblemServiceUnavailable: {codes.Unavailable, ReasonUnavailable},
	}
	cases := []struct {
		name    string
		outcome idem.Outcome
		err     error
		hint    time.Duration // the base of the RetryInfo; 0: none
	}{
		{"in progress", idem.OutcomeInProgress, idem.ErrInProgress, time.Second},
		{"pending", idem.OutcomeInProgress, idem.ErrPending, 30 * time.Second},
		{"key reused", idem.OutcomeKeyReused, idem.ErrKeyReused, 0},
		{"key missing", idem.OutcomeNone, idem.ErrKeyMissing, 0},
		{"key invalid", idem.OutcomeNone, &idem.KeyError{Reason: "empty"}, 0},
		{"request invalid: key", idem.OutcomeNone, &idem.RequestError{Field: "Key", Reason: "contains NUL"}, 0},
		{"request refused by the store", idem.OutcomeNone, &idem.RequestError{Field: "Request", Reason: "refused"}, 0},
		{"request invalid: scope", idem.OutcomeNone, &idem.RequestError{Field: "Scope", Reason: "empty"}, 0},
		{"store unavailable", idem.OutcomeNone, fmt.Errorf("idem: claim: %w: %w", idem.ErrUnavailable, cause), 2 * time.Second},
		{"nil work", idem.OutcomeNone, errors.New("idem: nil work"), 2 * time.Second},
	}
	ic := &interceptor{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := idem.Classify(tc.outcome, tc.err)
			require.NotEmpty(t, d.Slug, "a refusal")
			st := status.Convert(ic.refuse(context.Background(), "/a.S/M", tc.outcome, tc.err))
			require.Equal(t, want[d.Slug].code, st.Code(), st.Message())
			var info *errdetails.ErrorInfo
			var retry *errdetails.RetryInfo
			for _, x := range st.Details() {
				switch x := x.(type) {
				case *errdetails.ErrorInfo:
					info = x
				case *errdetails.RetryInfo:
					retry = x
				}
			}
			require.NotNil(t, info)
			require.Equal(t, want[d.Slug].reason, info.GetReason())
			if tc.hint == 0 {
				require.Nil(t, retry, "no RetryInfo where Classify gives no RetryAfter")
				return
			}
			require.NotNil(t, retry, "RetryInfo where Classify gives a RetryAfter")
			got := retry.GetRetryDelay().AsDuration()
			secs := int64((tc.hint + time.Second - 1) / time.Second)
			require.Zero(t, got%time.Second)
			require.GreaterOrEqual(t, int64(got/time.Second), secs)
			require.LessOrEqual(t, int64(got/time.Second), secs+(secs+4)/5)
		})
	}
}

// A call whose own context has ended gets the context's code, not
// Unavailable: the guard could not decide because the client left.
func TestRefuseEndedContext(t *testing.T) {
	ic := &interceptor{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := ic.refuse(ctx, "/a.S/M", idem.OutcomeNone, fmt.Errorf("idem: claim: %w", context.Canceled))
	require.Equal(t, codes.Canceled, status.Code(err))
}
