package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// classifyCase is one result the guard (or ParseKey, or a transport without
// a caller) can give, and what it means to the client.
type classifyCase struct {
	name    string
	outcome Outcome
	err     error
	slug    string
	status  int
	hint    time.Duration // the base RetryAfter jitters; 0: no RetryAfter
}

// The documented bases of Decision.RetryAfter.
const (
	inProgressHint  = time.Second
	pendingHint     = 30 * time.Second
	unavailableHint = 2 * time.Second
)

// classifyCases are every Outcome with every error Do returns with it, in
// the shapes Do wraps them in, and the errors of what comes before Do.
func classifyCases() []classifyCase {
	cause := errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	answered := func(name string, o Outcome, err error) classifyCase {
		return classifyCase{name: name, outcome: o, err: err}
	}
	return []classifyCase{
		answered("executed", OutcomeExecuted, nil),
		answered("executed unstored, a 5xx", OutcomeExecutedUnstored, nil),
		answered("executed unstored, the work's error", OutcomeExecutedUnstored, errors.New("provider timeout")),
		answered("executed unstored, answer not storable", OutcomeExecutedUnstored, fmt.Errorf("idem: complete: %w", ErrInvalid)),
		answered("executed unstored, answer write failed", OutcomeExecutedUnstored, fmt.Errorf("idem: complete: %w: %w", ErrUnavailable, cause)),
		answered("executed released, 429", OutcomeExecutedReleased, nil),
		answered("executed released, ErrRetrySafe", OutcomeExecutedReleased, fmt.Errorf("breaker open: %w", ErrRetrySafe)),
		answered("replayed", OutcomeReplayed, nil),
		{name: "in progress", outcome: OutcomeInProgress, err: ErrInProgress,
			slug: ProblemInProgress, status: http.StatusConflict, hint: inProgressHint},
		{name: "pending", outcome: OutcomeInProgress, err: ErrPending,
			slug: ProblemPending, status: http.StatusConflict, hint: pendingHint},
		{name: "key reused", outcome: OutcomeKeyReused, err: ErrKeyReused,
			slug: ProblemKeyReused, status: http.StatusUnprocessableEntity},
		{name: "key missing (ParseKey)", outcome: OutcomeNone, err: ErrKeyMissing,
			slug: ProblemKeyMissing, status: http.StatusBadRequest},
		{name: "key invalid (ParseKey)", outcome: OutcomeNone, err: &KeyError{Reason: "empty"},
			slug: ProblemKeyInvalid, status: http.StatusBadRequest},
		{name: "request invalid: key", outcome: OutcomeNone, err: &RequestError{Field: "Key", Reason: "contains NUL"},
			slug: ProblemKeyInvalid, status: http.StatusBadRequest},
		{name: "request invalid: fingerprint", outcome: OutcomeNone, err: &RequestError{Field: "Fingerprint", Reason: "zero"},
			slug: ProblemKeyInvalid, status: http.StatusBadRequest},
		{name: "request refused by the store", outcome: OutcomeNone, err: &RequestError{Field: "Request", Reason: "refused by the store: durable: invalid"},
			slug: ProblemKeyInvalid, status: http.StatusBadRequest},
		{name: "request invalid: scope", outcome: OutcomeNone, err: &RequestError{Field: "Scope", Reason: "empty"},
			slug: ProblemUnauthenticated, status: http.StatusUnauthorized},
		{name: "store unavailable", outcome: OutcomeNone, err: fmt.Errorf("idem: claim: %w: %w", ErrUnavailable, cause),
			slug: ProblemServiceUnavailable, status: http.StatusServiceUnavailable, hint: unavailableHint},
		{name: "ctx canceled", outcome: OutcomeNone, err: fmt.Errorf("idem: claim: %w: %w", context.Canceled, cause),
			slug: ProblemServiceUnavailable, status: http.StatusServiceUnavailable, hint: unavailableHint},
		{name: "ctx deadline", outcome: OutcomeNone, err: context.DeadlineExceeded,
			slug: ProblemServiceUnavailable, status: http.StatusServiceUnavailable, hint: unavailableHint},
		{name: "nil work", outcome: OutcomeNone, err: errors.New("idem: nil work"),
			slug: ProblemServiceUnavailable, status: http.StatusServiceUnavailable, hint: unavailableHint},
	}
}

// requireJittered requires got to be the jitter of hint: whole seconds from
// hint (rounded up) to hint + max(1s, hint/5).
func requireJittered(t *testing.T, hint, got time.Duration) {
	t.Helper()
	require.Zero(t, got%time.Second, "whole seconds: %v", got)
	secs := int64((hint + time.Second - 1) / time.Second)
	require.GreaterOrEqual(t, int64(got/time.Second), secs, "never below the hint %v", hint)
	require.LessOrEqual(t, int64(got/time.Second), secs+(secs+4)/5, "never past the hint %v by more than the jitter", hint)
}

func TestClassify(t *testing.T) {
	for _, tc := range classifyCases() {
		t.Run(tc.name, func(t *testing.T) {
			d := Classify(tc.outcome, tc.err)
			require.Equal(t, tc.slug, d.Slug)
			require.Equal(t, tc.status, d.Status)
			if tc.hint == 0 {
				require.Zero(t, d.RetryAfter)
				return
			}
			requireJittered(t, tc.hint, d.RetryAfter)
		})
	}
}

// The middleware refuses as Classify decides: the status, the type and the
// Retry-After of every refusal are Classify's.
func TestMiddlewareAgreesWithClassify(t *testing.T) {
	g := &Guard{log: slog.New(slog.DiscardHandler)}
	m := g.Middleware(func(*http.Request) (string, bool) { return "u", true }, nil)(nil).(*middleware)
	for _, tc := range classifyCases() {
		if tc.slug == "" {
			continue // answered: the middleware sends the answer
		}
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			m.refuse(w, httptest.NewRequest(http.MethodPost, "/orders", nil), tc.outcome, tc.err)
			d := Classify(tc.outcome, tc.err)
			require.Equal(t, d.Status, w.Code)
			var p Problem
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
			require.Equal(t, ProblemBase+d.Slug, p.Type)
			require.Equal(t, d.Status, p.Status)
			if tc.hint == 0 {
				require.Empty(t, w.Header().Values("Retry-After"))
				return
			}
			secs, err := strconv.Atoi(w.Header().Get("Retry-After"))
			require.NoError(t, err)
			requireJittered(t, tc.hint, time.Duration(secs)*time.Second)
		})
	}
}
