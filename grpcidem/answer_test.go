package grpcidem

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemguard/idem"
)

// The table of the package documentation, code by code.
func TestDisposition(t *testing.T) {
	const (
		release = -1
		pending = -2
	)
	for _, tc := range []struct {
		code codes.Code
		want int // the stored HTTP-like status, or release / pending
	}{
		{codes.OK, http.StatusOK},
		{codes.InvalidArgument, http.StatusBadRequest},
		{codes.FailedPrecondition, http.StatusBadRequest},
		{codes.OutOfRange, http.StatusBadRequest},
		{codes.Unauthenticated, http.StatusUnauthorized},
		{codes.PermissionDenied, http.StatusForbidden},
		{codes.NotFound, http.StatusNotFound},
		{codes.AlreadyExists, http.StatusConflict},
		{codes.ResourceExhausted, release},
		{codes.Unimplemented, release},
		{codes.Canceled, pending},
		{codes.Unknown, pending},
		{codes.DeadlineExceeded, pending},
		{codes.Aborted, pending},
		{codes.Internal, pending},
		{codes.Unavailable, pending},
		{codes.DataLoss, pending},
	} {
		t.Run(tc.code.String(), func(t *testing.T) {
			var resp any
			var err error
			if tc.code == codes.OK {
				resp = wrapperspb.String("ok")
			} else {
				err = status.Error(tc.code, "msg")
			}
			a, derr := disposition(resp, err, 1<<20)
			switch tc.want {
			case release:
				require.ErrorIs(t, derr, idem.ErrRetrySafe)
			case pending:
				require.ErrorIs(t, derr, errNotFinal)
				require.NotErrorIs(t, derr, idem.ErrRetrySafe)
			default:
				require.NoError(t, derr)
				require.Equal(t, tc.want, a.Status)
				gotResp, gotErr, rerr := replay(a)
				require.NoError(t, rerr)
				if tc.code == codes.OK {
					require.NoError(t, gotErr)
					require.True(t, proto.Equal(resp.(proto.Message), gotResp.(proto.Message)))
				} else {
					require.Nil(t, gotResp)
					require.Equal(t, tc.code, status.Code(gotErr))
					require.Equal(t, "msg", status.Convert(gotErr).Message())
				}
			}
		})
	}
}

func TestDispositionUnstorableResults(t *testing.T) {
	for name, tc := range map[string]struct {
		resp any
		err  error
	}{
		"not a status error": {err: errors.New("boom")},
		"wrapped context":    {err: fmt.Errorf("charge: %w", errors.New("context canceled"))},
		"not proto":          {resp: struct{}{}},
		"nil message":        {resp: (*wrapperspb.StringValue)(nil)},
		"nil":                {},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := disposition(tc.resp, tc.err, 1<<20)
			require.Error(t, err)
			require.NotErrorIs(t, err, idem.ErrRetrySafe)
		})
	}
	_, err := disposition(wrapperspb.String(strings.Repeat("x", 100)), nil, 10)
	require.ErrorIs(t, err, errTooLarge)
}

func TestAnswerKeepsStatusDetails(t *testing.T) {
	st, err := status.New(codes.FailedPrecondition, "card declined").
		WithDetails(&errdetails.ErrorInfo{Reason: "CARD_DECLINED", Domain: "payments.example"})
	require.NoError(t, err)
	a, err := Answer(nil, st.Err())
	require.NoError(t, err)
	require.Equal(t, "google.rpc.Status", a.Header.Get(headerType))
	_, got, err := replay(a)
	require.NoError(t, err)
	require.True(t, proto.Equal(st.Proto(), status.Convert(got).Proto()))
}

func TestReplayRefusesUndecodableAnswers(t *testing.T) {
	for name, a := range map[string]idem.Response{
		"no type":        {Status: 200, Body: []byte{}},
		"invalid name":   {Status: 200, Header: http.Header{headerType: {"not a name!"}}},
		"unknown type":   {Status: 200, Header: http.Header{headerType: {"idemtest.Gone"}}},
		"corrupt body":   {Status: 200, Header: http.Header{headerType: {"google.protobuf.StringValue"}}, Body: []byte{0xff}},
		"status code OK": {Status: 400, Header: http.Header{headerType: {"google.rpc.Status"}}, Body: []byte{}},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := replay(a)
			require.Error(t, err)
		})
	}
}

// A retry's message, marshalled anew, must get the same fingerprint even
// when its maps iterate in another order; another method or message must not.
func TestFingerprint(t *testing.T) {
	fields := map[string]any{}
	for i := range 32 {
		fields[fmt.Sprintf("k%02d", i)] = float64(i)
	}
	fp := func(method string, m map[string]any) idem.Fingerprint {
		s, err := structpb.NewStruct(m)
		require.NoError(t, err)
		f, err := Fingerprint(method, s)
		require.NoError(t, err)
		return f
	}
	first := fp("/a.S/M", fields)
	for range 20 {
		require.Equal(t, first, fp("/a.S/M", fields))
	}
	require.NotEqual(t, first, fp("/a.S/N", fields))
	fields["k00"] = float64(1)
	require.NotEqual(t, first, fp("/a.S/M", fields))

	_, err := Fingerprint("/a.S/M", struct{}{})
	require.Error(t, err)
	_, err = Fingerprint("/a.S/M", nil)
	require.Error(t, err)
}

func TestParseKey(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string
		want   string
		reason string // "" when valid
	}{
		{"uuid", []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}, "8e03978e-40d5-43e8-bc93-6894a57f9324", ""},
		{"inner space", []string{"order 42"}, "order 42", ""},
		{"quotes are literal", []string{`"k"`}, `"k"`, ""},
		{"255", []string{strings.Repeat("k", 255)}, strings.Repeat("k", 255), ""},
		{"256", []string{strings.Repeat("k", 256)}, "", "longer than 255 characters"},
		{"empty", []string{""}, "", "empty"},
		{"two values", []string{"a", "b"}, "", "repeated metadata entry"},
		{"list", []string{"a,b"}, "", "a list of keys; send exactly one"},
		{"leading space", []string{" a"}, "", "leading or trailing space"},
		{"trailing space", []string{"a "}, "", "leading or trailing space"},
		{"tab", []string{"a\tb"}, "", "not printable ASCII"},
		{"non-ASCII", []string{"clé"}, "", "not printable ASCII"},
		{"DEL", []string{"a\x7f"}, "", "not printable ASCII"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseKey(tc.values)
			if tc.reason == "" {
				require.NoError(t, err)
				require.Equal(t, tc.want, got)
				return
			}
			var ke *idem.KeyError
			require.ErrorAs(t, err, &ke)
			require.Equal(t, tc.reason, ke.Reason)
		})
	}
	_, err := parseKey(nil)
	require.ErrorIs(t, err, idem.ErrKeyMissing)
}
