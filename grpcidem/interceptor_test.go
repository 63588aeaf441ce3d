package grpcidem_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/grpcidem"
	"github.com/idemguard/idem/lock"
)

// counter is a handler that charges: it counts its runs and answers with
// the run number and the amount asked.
type counter struct{ runs atomic.Int64 }

func (c *counter) handle(_ context.Context, _ string, req proto.Message) (proto.Message, error) {
	n := c.runs.Add(1)
	amount := req.(*structpb.Struct).GetFields()["amount"].GetNumberValue()
	return structpb.NewStruct(map[string]any{"charge": fmt.Sprintf("ch_%d", n), "amount": amount})
}

// order is a request whose map has enough entries that a non-deterministic
// encoding would differ between two marshals.
func order(t *testing.T, amount float64) *structpb.Struct {
	m := map[string]any{"amount": amount, "currency": "EUR"}
	for i := range 12 {
		m[fmt.Sprintf("line_%02d", i)] = float64(i)
	}
	return mustStruct(t, m)
}

// requireRefusal checks a refusal's code and ErrorInfo and returns its
// RetryInfo delay (0 without one).
func requireRefusal(t *testing.T, err error, code codes.Code, reason string) time.Duration {
	t.Helper()
	st, ok := status.FromError(err)
	require.True(t, ok, "not a status: %v", err)
	require.Equal(t, code, st.Code(), st.Message())
	var info *errdetails.ErrorInfo
	var delay time.Duration
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.RetryInfo:
			delay = d.GetRetryDelay().AsDuration()
		}
	}
	require.NotNil(t, info, "no ErrorInfo in %v", st.Details())
	require.Equal(t, reason, info.GetReason())
	require.Equal(t, grpcidem.ErrorDomain, info.GetDomain())
	return delay
}

// requireRetryDelay requires a RetryInfo delay that is the jitter of hint,
// as idem.Classify draws it: whole seconds from the hint (rounded up) to the
// hint plus max(1s, a fifth of it); none (0) for a negative hint.
func requireRetryDelay(t *testing.T, hint, got time.Duration) {
	t.Helper()
	if hint < 0 {
		require.Zero(t, got, "a negative hint sends no RetryInfo")
		return
	}
	require.Zero(t, got%time.Second, "whole seconds: %v", got)
	secs := int64((hint + time.Second - 1) / time.Second)
	require.GreaterOrEqual(t, int64(got/time.Second), secs, "never below the hint %v", hint)
	require.LessOrEqual(t, int64(got/time.Second), secs+(secs+4)/5, "never past the hint %v by more than the jitter", hint)
}

func TestFirstCallRunsAndRetryIsReplayed(t *testing.T) {
	db := newTestDB(t)
	var c counter
	conn := serve(t, grpcidem.UnaryServerInterceptor(newGuard(t, db, nil), scopeFromMetadata, nil), c.handle)
	key := newKey()

	first := charge(t, conn, "user-1", key, order(t, 42))
	require.NoError(t, first.err)
	require.False(t, first.replayed)
	require.Equal(t, "ch_1", first.resp.GetFields()["charge"].GetStringValue())

	for range 3 {
		retry := charge(t, conn, "user-1", key, order(t, 42)) // a new message: its map is marshalled anew
		require.NoError(t, retry.err)
		require.True(t, retry.replayed)
		require.True(t, proto.Equal(first.resp, retry.resp), "replayed %v, want %v", retry.resp, first.resp)
	}
	require.EqualValues(t, 1, c.runs.Load())
}

func TestConcurrentCallersOneExecution(t *testing.T) {
	db := newTestDB(t)
	const callers = 16
	var runs atomic.Int64
	unblock := make(chan struct{})
	h := func(ctx context.Context, _ string, _ proto.Message) (proto.Message, error) {
		runs.Add(1)
		select {
		case <-unblock:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return structpb.NewStruct(map[string]any{"charge": "ch_1"})
	}
	conn := serve(t, grpcidem.UnaryServerInterceptor(newGuard(t, db, nil), scopeFromMetadata, nil), h)
	key := newKey()

	results := make(chan result, callers)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() { results <- charge(t, conn, "user-1", key, order(t, 42)) })
	}
	// The handler blocks until every other caller has been answered, so each
	// of them must have been refused as in progress.
	for range callers - 1 {
		r := <-results
		requireRefusal(t, r.err, codes.Aborted, grpcidem.ReasonInProgress)
	}
	close(unblock)
	wg.Wait()
	last := <-results
	require.NoError(t, last.err)
	require.False(t, last.replayed)
	require.EqualValues(t, 1, runs.Load())

	again := charge(t, conn, "user-1", key, order(t, 42))
	require.NoError(t, again.err)
	require.True(t, again.replayed)
	require.True(t, proto.Equal(last.resp, again.resp))
	require.EqualValues(t, 1, runs.Load())
}

func TestKeyReusedWithAnotherRequest(t *testing.T) {
	db := newTestDB(t)
	var c counter
	conn := serve(t, grpcidem.UnaryServerInterceptor(newGuard(t, db, nil), scopeFromMetadata, nil), c.handle)
	key := newKey()
	require.NoError(t, charge(t, conn, "user-1", key, order(t, 42)).err)

	r := charge(t, conn, "user-1", key, order(t, 43))
	requireRefusal(t, r.err, codes.FailedPrecondition, grpcidem.ReasonKeyReused)

	// The same key on another method is another request too.
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-user", "user-1", grpcidem.MetadataKey, key)
	err := conn.Invoke(ctx, methodBalance, wrapperspb.String("acct_1"), new(wrapperspb.StringValue))
	requireRefusal(t, err, codes.FailedPrecondition, grpcidem.ReasonKeyReused)
	require.EqualValues(t, 1, c.runs.Load())
}

func TestMissingKey(t *testing.T) {
	db := newTestDB(t)
	g := newGuard(t, db, nil)

	t.Run("required", func(t *testing.T) {
		var c counter
		conn := serve(t, grpcidem.UnaryServerInterceptor(g, scopeFromMetadata, nil), c.handle)
		r := charge(t, conn, "user-1", "", order(t, 42))
		requireRefusal(t, r.err, codes.InvalidArgument, grpcidem.ReasonKeyMissing)
		require.Zero(t, c.runs.Load())
	})
	t.Run("optional", func(t *testing.T) {
		var c counter
		conn := serve(t, grpcidem.UnaryServerInterceptor(g, scopeFromMetadata, &grpcidem.Config{OptionalKey: true}), c.handle)
		for range 2 {
			r := charge(t, conn, "", "", order(t, 42)) // unguarded: no caller needed either
			require.NoError(t, r.err)
			require.False(t, r.replayed)
		}
		require.EqualValues(t, 2, c.runs.Load())
		// A key present is still checked.
		requireRefusal(t, charge(t, conn, "user-1", "a,b", order(t, 42)).err, codes.InvalidArgument, grpcidem.ReasonKeyInvalid)
	})
}

func TestInvalidKey(t *testing.T) {
	db := newTestDB(t)
	var c counter
	conn := serve(t, grpcidem.UnaryServerInterceptor(newGuard(t, db, nil), scopeFromMetadata, nil), c.handle)
	for name, values := range map[string][]string{
		"too long":       {strings.Repeat("k", idem.MaxKeyLen+1)},
		"list":           {"key-1, key-2"},
		"two values":     {"key-1", "key-2"},
		"trailing space": {"key-1 "},
	} {
		t.Run(name, func(t *testing.T) {
			md := metadata.MD{"x-user": {"user-1"}, grpcidem.MetadataKey: values}
			r := callWith(t.Context(), conn, md, order(t, 42))
			requireRefusal(t, r.err, codes.InvalidArgument, grpcidem.ReasonKeyInvalid)
		})
	}
	require.Zero(t, c.runs.Load())

	r := charge(t, conn, "user-1", strings.Repeat("k", idem.MaxKeyLen), order(t, 42))
	require.NoError(t, r.err, "a key of exactly 255 characters is valid")
}

func TestUnauthenticated(t *testing.T) {
	db := newTestDB(t)
	var c counter
	conn := serve(t, grpcidem.UnaryServerInterceptor(newGuard(t, db, nil), scopeFromMetadata, nil), c.handle)

	requireRefusal(t, charge(t, conn, "", newKey(), order(t, 42)).err, codes.Unauthenticated, grpcidem.ReasonUnauthenticated)
	// A scope the guard cannot key on (too long) is no caller either.
	requireRefusal(t, charge(t, conn, strings.Repeat("u", idem.MaxScopeLen+1), newKey(), order(t, 42)).err,
		codes.Unauthenticated, grpcidem.ReasonUnauthenticated)
	require.Zero(t, c.runs.Load())
}

func TestScopesAreIsolated(t *testing.T) {
	db := newTestDB(t)
	var c counter
	conn := serve(t, grpcidem.UnaryServerInterceptor(newGuard(t, db, nil), scopeFromMetadata, nil), c.handle)
	key := newKey()

	a := charge(t, conn, "user-a", key, order(t, 42))
	b := charge(t, conn, "user-b", key, order(t, 42))
	require.NoError(t, a.err)
	require.NoError(t, b.err)
	require.False(t, b.replayed)
	require.Equal(t, "ch_1", a.resp.GetFields()["charge"].GetStringValue())
	require.Equal(t, "ch_2", b.resp.GetFields()["charge"].GetStringValue())
	require.EqualValues(t, 2, c.runs.Load())
}

func TestInProgressWhileFirstRuns(t *testing.T) {
	db := newTestDB(t)
	started, unblock := make(chan struct{}), make(chan struct{})
	var runs atomic.Int64
	h := func(ctx context.Context, _ string, _ proto.Message) (proto.Message, error) {
		runs.Add(1)
		close(started)
		<-unblock
		return structpb.NewStruct(map[string]any{"charge": "ch_1"})
	}
	conn := serve(t, grpcidem.UnaryServerInterceptor(newGuard(t, db, nil), scopeFromMetadata, nil), h)
	key := newKey()

	first := make(chan result, 1)
	go func() { first <- charge(t, conn, "user-1", key, order(t, 42)) }()
	<-started
	r := charge(t, conn, "user-1", key, order(t, 42))
	requireRetryDelay(t, time.Second, requireRefusal(t, r.err, codes.Aborted, grpcidem.ReasonInProgress))
	close(unblock)
	require.NoError(t, (<-first).err)

	r = charge(t, conn, "user-1", key, order(t, 42))
	require.NoError(t, r.err)
	require.True(t, r.replayed)
	require.EqualValues(t, 1, runs.Load())
}

func TestFinalErrorIsStoredAndReplayed(t *testing.T) {
	db := newTestDB(t)
	var runs atomic.Int64
	h := func(context.Context, string, proto.Message) (proto.Message, error) {
		runs.Add(1)
		st, err := status.New(codes.NotFound, "card card_9 not found").
			WithDetails(&errdetails.ResourceInfo{ResourceType: "card", ResourceName: "card_9"})
		if err != nil {
			return nil, err
		}
		return nil, st.Err()
	}
	conn := serve(t, grpcidem.UnaryServerInterceptor(newGuard(t, db, nil), scopeFromMetadata, nil), h)
	key := newKey()

	first := charge(t, conn, "user-1", key, order(t, 42))
	retry := charge(t, conn, "user-1", key, order(t, 42))
	require.False(t, first.replayed)
	require.True(t, retry.replayed)
	want, got := status.Convert(first.err), status.Convert(retry.err)
	require.Equal(t, codes.NotFound, want.Code())
	require.True(t, proto.Equal(want.Proto(), got.Proto()), "replayed %v, want %v", got.Proto(), want.Proto())
	require.Len(t, got.Details(), 1)
	require.EqualValues(t, 1, runs.Load())
}

// An Internal error leaves the key in progress; a reconciler that learns the
// outcome settles it with the stored form Answer gives, and retries are then
// replayed that answer.
func TestInternalLeavesKeyInProgressUntilSettled(t *testing.T) {
	db := newTestDB(t)
	g := newGuard(t, db, nil)
	var runs atomic.Int64
	intents := make(chan idem.Token, 1)
	h := func(ctx context.Context, _ string, _ proto.Message) (proto.Message, error) {
		runs.Add(1)
		id := idem.ExecutionFromContext(ctx).Intent // the handler runs in the guard's work context
		intents <- id
		return nil, status.Error(codes.Internal, "provider timed out")
	}
	conn := serve(t, grpcidem.UnaryServerInterceptor(g, scopeFromMetadata, nil), h)
	key := newKey()

	first := charge(t, conn, "user-1", key, order(t, 42))
	require.Equal(t, codes.Internal, status.Code(first.err), "the first caller gets the handler's own error")
	r := charge(t, conn, "user-1", key, order(t, 42))
	requireRefusal(t, r.err, codes.Aborted, grpcidem.ReasonInProgress)

	paid, err := structpb.NewStruct(map[string]any{"charge": "ch_77"})
	require.NoError(t, err)
	answer, err := grpcidem.Answer(paid, nil)
	require.NoError(t, err)
	intent := <-intents
	require.NotZero(t, intent, "the handler runs in the guard's work context")
	row, err := db.store.Get(t.Context(), "user-1", key)
	require.NoError(t, err)
	require.NoError(t, g.Settle(t.Context(), "user-1", key, row.Owner, answer))

	r = charge(t, conn, "user-1", key, order(t, 42))
	require.NoError(t, r.err)
	require.True(t, r.replayed)
	require.True(t, proto.Equal(paid, r.resp))
	require.EqualValues(t, 1, runs.Load())
}

func TestPendingKeyIsReportedAsPending(t *testing.T) {
	db := newTestDB(t)
	g := newGuard(t, db, nil)
	h := func(context.Context, string, proto.Message) (proto.Message, error) {
		return nil, status.Error(codes.Unavailable, "provider down")
	}
	conn := serve(t, grpcidem.UnaryServerInterceptor(g, scopeFromMetadata, nil), h)
	key := newKey()
	require.Equal(t, codes.Unavailable, status.Code(charge(t, conn, "user-1", key, order(t, 42)).err))

	db.age(t, g.MaxHold()+time.Minute) // no request holds a key this long
	r := charge(t, conn, "user-1", key, order(t, 42))
	requireRetryDelay(t, 30*time.Second, requireRefusal(t, r.err, codes.Aborted, grpcidem.ReasonPending))
}

func TestRetrySafeResultsReleaseTheKey(t *testing.T) {
	db := newTestDB(t)
	g := newGuard(t, db, nil)
	for name, tc := range map[string]struct {
		code codes.Code
		mark bool // the handler calls idem.MarkRetrySafe first
	}{
		"ResourceExhausted": {code: codes.ResourceExhausted},
		"Unimplemented":     {code: codes.Unimplemented},
		"MarkRetrySafe":     {code: codes.Unavailable, mark: true},
	} {
		t.Run(name, func(t *testing.T) {
			var runs atomic.Int64
			h := func(ctx context.Context, _ string, _ proto.Message) (proto.Message, error) {
				if runs.Add(1) == 1 {
					if tc.mark && !idem.MarkRetrySafe(ctx) {
						return nil, status.Error(codes.DataLoss, "not in a guarded execution")
					}
					return nil, status.Error(tc.code, "first attempt")
				}
				return structpb.NewStruct(map[string]any{"charge": "ch_2"})
			}
			conn := serve(t, grpcidem.UnaryServerInterceptor(g, scopeFromMetadata, nil), h)
			key := newKey()
			first := charge(t, conn, "user-1", key, order(t, 42))
			require.Equal(t, tc.code, status.Code(first.err))
			second := charge(t, conn, "user-1", key, order(t, 42))
			require.NoError(t, second.err)
			require.False(t, second.replayed, "the key was released: the handler ran again")
			require.EqualValues(t, 2, runs.Load())
		})
	}
}

func TestStoreUnavailable(t *testing.T) {
	down, err := pgxpool.New(t.Context(), "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=1")
	require.NoError(t, err)
	t.Cleanup(down.Close)
	store, err := durable.New(down, nil)
	require.NoError(t, err)
	g, err := idem.New(store, &idem.Config{Logger: quiet, StoreTimeout: time.Second})
	require.NoError(t, err)
	var c counter
	conn := serve(t, grpcidem.UnaryServerInterceptor(g, scopeFromMetadata, nil), c.handle)

	r := charge(t, conn, "user-1", newKey(), order(t, 42))
	requireRetryDelay(t, 2*time.Second, requireRefusal(t, r.err, codes.Unavailable, grpcidem.ReasonUnavailable))
	require.NotContains(t, status.Convert(r.err).Message(), "127.0.0.1", "internal error text never reaches the client")
	require.Zero(t, c.runs.Load())
}

func TestHybridStrategy(t *testing.T) {
	db := newTestDB(t)
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	locker, err := lock.New(rdb, nil)
	require.NoError(t, err)
	g := newGuard(t, db, &idem.Config{Lock: locker})
	require.Equal(t, "hybrid", g.Strategy())
	var c counter
	conn := serve(t, grpcidem.UnaryServerInterceptor(g, scopeFromMetadata, nil), c.handle)
	key := newKey()

	first := charge(t, conn, "user-1", key, order(t, 42))
	require.NoError(t, first.err)
	require.True(t, mr.Exists(locker.Key("user-1", key)), "the call took a lease")
	retry := charge(t, conn, "user-1", key, order(t, 42))
	require.NoError(t, retry.err)
	require.True(t, retry.replayed)
	require.True(t, proto.Equal(first.resp, retry.resp))
	requireRefusal(t, charge(t, conn, "user-1", key, order(t, 1)).err, codes.FailedPrecondition, grpcidem.ReasonKeyReused)

	mr.FastForward(locker.TTL() + time.Second) // the lease is gone: the claim replays
	retry = charge(t, conn, "user-1", key, order(t, 42))
	require.NoError(t, retry.err)
	require.True(t, retry.replayed)

	mr.SetError("LOADING") // Redis failing: the guard falls back to the claim
	r := charge(t, conn, "user-1", newKey(), order(t, 42))
	require.NoError(t, r.err)
	require.EqualValues(t, 2, c.runs.Load())
}

func TestWithMethods(t *testing.T) {
	db := newTestDB(t)
	var c counter
	h := func(ctx context.Context, method string, req proto.Message) (proto.Message, error) {
		if method == methodBalance {
			return wrapperspb.String("100 EUR"), nil
		}
		return c.handle(ctx, method, req)
	}
	ic := grpcidem.UnaryServerInterceptor(newGuard(t, db, nil), scopeFromMetadata,
		&grpcidem.Config{Methods: func(m string) bool { return m == methodCharge }})
	conn := serve(t, ic, h)

	out := new(wrapperspb.StringValue)
	require.NoError(t, conn.Invoke(t.Context(), methodBalance, wrapperspb.String("acct_1"), out), "unguarded: no key, no caller")
	require.Equal(t, "100 EUR", out.GetValue())
	requireRefusal(t, charge(t, conn, "user-1", "", order(t, 42)).err, codes.InvalidArgument, grpcidem.ReasonKeyMissing)
}

func TestConfigFingerprint(t *testing.T) {
	db := newTestDB(t)
	var c counter
	// Leave out "sent_at", which the client sets anew on every retry.
	fp := func(method string, req any) (idem.Fingerprint, error) {
		s, ok := req.(*structpb.Struct)
		if !ok {
			return idem.Fingerprint{}, fmt.Errorf("unexpected %T", req)
		}
		if _, ok := s.GetFields()["poison"]; ok {
			return idem.Fingerprint{}, fmt.Errorf("cannot fingerprint")
		}
		s = proto.Clone(s).(*structpb.Struct)
		delete(s.Fields, "sent_at")
		return grpcidem.Fingerprint(method, s)
	}
	conn := serve(t, grpcidem.UnaryServerInterceptor(newGuard(t, db, nil), scopeFromMetadata,
		&grpcidem.Config{Fingerprint: fp}), c.handle)
	key := newKey()

	req := order(t, 42)
	req.Fields["sent_at"] = structpb.NewNumberValue(1)
	require.NoError(t, charge(t, conn, "user-1", key, req).err)
	req.Fields["sent_at"] = structpb.NewNumberValue(2)
	r := charge(t, conn, "user-1", key, req)
	require.NoError(t, r.err)
	require.True(t, r.replayed)

	req.Fields["poison"] = structpb.NewBoolValue(true)
	r = charge(t, conn, "user-1", newKey(), req)
	require.Equal(t, codes.Internal, status.Code(r.err))
	require.NotContains(t, status.Convert(r.err).Message(), "cannot fingerprint")
	require.EqualValues(t, 1, c.runs.Load())
}

// An answer too large to store (over idem.DefaultMaxBody) is delivered, and
// its key stays in progress.
func TestAnswerTooLargeIsDeliveredNotStored(t *testing.T) {
	db := newTestDB(t)
	var c counter
	h := func(ctx context.Context, method string, req proto.Message) (proto.Message, error) {
		c.runs.Add(1)
		return structpb.NewStruct(map[string]any{"blob": strings.Repeat("x", idem.DefaultMaxBody)})
	}
	conn := serve(t, grpcidem.UnaryServerInterceptor(newGuard(t, db, nil), scopeFromMetadata, nil), h)
	key := newKey()

	first := charge(t, conn, "user-1", key, order(t, 42))
	require.NoError(t, first.err)
	requireRefusal(t, charge(t, conn, "user-1", key, order(t, 42)).err, codes.Aborted, grpcidem.ReasonInProgress)
	require.EqualValues(t, 1, c.runs.Load())
}

// A stored answer whose message type the server does not link cannot be
// replayed: the client gets Internal, never another message.
func TestReplayOfUnknownTypeIsInternal(t *testing.T) {
	db := newTestDB(t)
	g := newGuard(t, db, nil)
	intents := make(chan idem.Token, 1)
	h := func(ctx context.Context, _ string, _ proto.Message) (proto.Message, error) {
		id := idem.ExecutionFromContext(ctx).Intent
		intents <- id
		return nil, status.Error(codes.Internal, "boom")
	}
	conn := serve(t, grpcidem.UnaryServerInterceptor(g, scopeFromMetadata, nil), h)
	key := newKey()
	require.Error(t, charge(t, conn, "user-1", key, order(t, 42)).err)

	answer, err := grpcidem.Answer(wrapperspb.String("x"), nil)
	require.NoError(t, err)
	answer.Header.Set("Grpc-Message-Type", "idemtest.Gone")
	<-intents
	row, err := db.store.Get(t.Context(), "user-1", key)
	require.NoError(t, err)
	require.NoError(t, g.Settle(t.Context(), "user-1", key, row.Owner, answer))

	r := charge(t, conn, "user-1", key, order(t, 42))
	require.Equal(t, codes.Internal, status.Code(r.err))
	require.False(t, r.replayed)
}

func TestInterceptorPanicsOnMisuse(t *testing.T) {
	db := newTestDB(t)
	g := newGuard(t, db, nil)
	require.Panics(t, func() { grpcidem.UnaryServerInterceptor(nil, scopeFromMetadata, nil) })
	require.Panics(t, func() { grpcidem.UnaryServerInterceptor(g, nil, nil) })
}
