package grpcidem_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/grpcidem"
	"github.com/idemguard/idem/internal/clock"
	"github.com/idemguard/idem/reconcile"
)

// A handler that joins its answer to its own transaction (idem.Complete) and
// then fails, as when the commit's reply was lost: the first caller gets the
// committed answer, as every retry does, not the handler's error.
func TestJoinedAnswerIsWhatEveryCallerGets(t *testing.T) {
	db := newTestDB(t)
	g := newGuard(t, db, nil)
	paid := mustStruct(t, map[string]any{"charge": "ch_joined"})
	var runs atomic.Int64
	h := func(ctx context.Context, _ string, _ proto.Message) (proto.Message, error) {
		runs.Add(1)
		tx, err := db.pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		answer, err := grpcidem.Answer(paid, nil)
		if err != nil {
			return nil, err
		}
		if err := idem.Complete(ctx, tx, answer); err != nil {
			return nil, err
		}
		if err := tx.Commit(ctx); err != nil {
			return nil, err
		}
		return nil, status.Error(codes.Unavailable, "the commit's reply was lost")
	}
	conn := serve(t, grpcidem.UnaryServerInterceptor(g, scopeFromMetadata, nil), h)
	key := newKey()

	first := charge(t, conn, "user-1", key, order(t, 42))
	require.NoError(t, first.err, "the first caller gets the committed answer")
	require.False(t, first.replayed)
	require.True(t, proto.Equal(paid, first.resp), "got %v", first.resp)

	retry := charge(t, conn, "user-1", key, order(t, 42))
	require.NoError(t, retry.err)
	require.True(t, retry.replayed)
	require.True(t, proto.Equal(paid, retry.resp), "got %v", retry.resp)
	require.EqualValues(t, 1, runs.Load())
	require.EqualValues(t, 1, g.Stats().AnswerMismatches, "the mismatch is counted")
}

// httpAnswer is the answer a service that serves HTTP and gRPC keeps in one
// form, whichever transport the key came from: 201 with a JSON body.
func httpAnswer(t *testing.T, charge string) idem.Response {
	t.Helper()
	body, err := json.Marshal(map[string]string{"charge": charge})
	require.NoError(t, err)
	return idem.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
}

// renderJSON is a RenderFunc for httpAnswer's form: a 2xx JSON body is the
// Charge reply, a 404 is NotFound.
func renderJSON(fullMethod string, a idem.Response) (any, error) {
	switch {
	case fullMethod != methodCharge:
		return nil, errors.New("no rendering for " + fullMethod)
	case a.Status == http.StatusNotFound:
		return nil, status.Error(codes.NotFound, string(a.Body))
	case a.Status/100 != 2:
		return nil, errors.New("unexpected status")
	}
	var m map[string]any
	if err := json.Unmarshal(a.Body, &m); err != nil {
		return nil, err
	}
	return structpb.NewStruct(m)
}

// A key left in progress by an Internal error is settled by a reconciler
// against PostgreSQL; its retry gets the settled answer, whether the
// resolver answers in grpcidem's own form (Answer) or in a form of its own
// that the interceptor's RenderFunc renders (Config.Render).
func TestReconciledAnswerIsReplayed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     *grpcidem.Config
		resolve func(t *testing.T) (idem.Response, *structpb.Struct)
	}{
		{"Answer's form", nil, func(t *testing.T) (idem.Response, *structpb.Struct) {
			want := mustStruct(t, map[string]any{"charge": "ch_77"})
			a, err := grpcidem.Answer(want, nil)
			require.NoError(t, err)
			return a, want
		}},
		{"rendered", &grpcidem.Config{Render: renderJSON}, func(t *testing.T) (idem.Response, *structpb.Struct) {
			return httpAnswer(t, "ch_78"), mustStruct(t, map[string]any{"charge": "ch_78"})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := newTestDB(t)
			g := newGuard(t, db, nil)
			var runs atomic.Int64
			h := func(context.Context, string, proto.Message) (proto.Message, error) {
				runs.Add(1)
				return nil, status.Error(codes.Internal, "provider timed out")
			}
			conn := serve(t, grpcidem.UnaryServerInterceptor(g, scopeFromMetadata, tc.cfg), h)
			key := newKey()
			require.Equal(t, codes.Internal, status.Code(charge(t, conn, "user-1", key, order(t, 42)).err))

			answer, want := tc.resolve(t)
			rec, err := reconcile.New(g, db.store, func(_ context.Context, it reconcile.Item) (reconcile.Decision, error) {
				require.Equal(t, key, it.Key)
				return reconcile.Decision{Verdict: reconcile.Settled, Response: answer}, nil
			}, nil)
			require.NoError(t, err)
			db.age(t, reconcile.DefaultMinAge+time.Minute) // past the Guard's MaxHold and MinAge
			// The reconciler counts the row's age on its own clock: give
			// it the head start the row was aged by.
			res, err := rec.RunOnce(clock.WithHeadStart(t.Context(), reconcile.DefaultMinAge+time.Minute))
			require.NoError(t, err)
			require.Equal(t, 1, res.Settled)

			for range 2 {
				r := charge(t, conn, "user-1", key, order(t, 42))
				require.NoError(t, r.err)
				require.True(t, r.replayed)
				require.True(t, proto.Equal(want, r.resp), "got %v, want %v", r.resp, want)
			}
			require.EqualValues(t, 1, runs.Load())
		})
	}
}

// A stored error answer in the reconciler's form is rendered as the status
// the RenderFunc gives; a stored answer the interceptor cannot render (no
// RenderFunc, or one that fails or gives a code that is not final) is
// Internal, and the handler does not run again.
func TestRenderedAnswers(t *testing.T) {
	notFound := idem.Response{Status: http.StatusNotFound, Body: []byte("no such card")}
	for _, tc := range []struct {
		name   string
		render grpcidem.RenderFunc
		answer idem.Response
		code   codes.Code
		msg    string
	}{
		{"error", renderJSON, notFound, codes.NotFound, "no such card"},
		{"no RenderFunc", nil, notFound, codes.Internal, "The stored answer to this request could not be read."},
		{"RenderFunc fails", renderJSON, idem.Response{Status: http.StatusConflict}, codes.Internal, "The stored answer to this request could not be read."},
		{"not final", func(string, idem.Response) (any, error) { return nil, status.Error(codes.Unavailable, "later") },
			notFound, codes.Internal, "The stored answer to this request could not be read."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := newTestDB(t)
			g := newGuard(t, db, nil)

			var runs atomic.Int64
			h := func(context.Context, string, proto.Message) (proto.Message, error) {
				runs.Add(1)
				return nil, status.Error(codes.Internal, "provider timed out")
			}
			conn := serve(t, grpcidem.UnaryServerInterceptor(g, scopeFromMetadata, &grpcidem.Config{Render: tc.render}), h)
			key := newKey()
			require.Equal(t, codes.Internal, status.Code(charge(t, conn, "user-1", key, order(t, 42)).err))
			row, err := db.store.Get(t.Context(), "user-1", key)
			require.NoError(t, err)
			require.NoError(t, g.Settle(t.Context(), "user-1", key, row.Owner, tc.answer))

			r := charge(t, conn, "user-1", key, order(t, 42))
			require.Equal(t, tc.code, status.Code(r.err), "%v", r.err)
			require.Equal(t, tc.msg, status.Convert(r.err).Message())
			require.Equal(t, tc.code != codes.Internal, r.replayed, "replayed only when sent")
			require.EqualValues(t, 1, runs.Load())
		})
	}
}
