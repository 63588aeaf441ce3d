package grpcidem_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/grpcidem"
	"github.com/idemguard/idem/idemclient"
)

// flakyStore fails the first fails claims, as an unreachable PostgreSQL.
type flakyStore struct {
	idem.Store
	fails atomic.Int32
}

func (s *flakyStore) Claim(ctx context.Context, p idem.ClaimParams) (idem.Record, bool, error) {
	if s.fails.Add(-1) >= 0 {
		return idem.Record{}, false, errors.New("connection refused")
	}
	return s.Store.Claim(ctx, p)
}

// call is one call as it reached the server, before grpcidem's interceptor,
// and what the server answered.
type call struct {
	key   []string
	bytes []byte // the request's deterministic encoding
	delay time.Duration
}

// clientBundle is a server with grpcidem's interceptor over a real
// PostgreSQL store, a plain connection to it and one with the client
// interceptor under a fake clock.
type clientBundle struct {
	plain, guarded *grpc.ClientConn
	runs           atomic.Int64

	mu     sync.Mutex
	calls  []call
	sleeps []time.Duration
	now    time.Time

	block   chan struct{} // when set, every run waits for it (or its context)
	started chan struct{} // one value per run, when it begins
	onSleep func(n int)
}

type clientSetup struct {
	failClaims int32
	block      bool
	// drop, when it returns true for the n-th call (from 1), closes the
	// server's connections once the call's answer is stored, before it is
	// sent.
	drop   func(n int) bool
	config *grpcidem.ClientConfig
}

// trackingListener remembers the server side of every connection.
type trackingListener struct {
	*bufconn.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *trackingListener) closeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		_ = c.Close()
	}
	l.conns = nil
}

func setupClient(t *testing.T, o clientSetup) *clientBundle {
	t.Helper()
	db := newTestDB(t)
	fs := &flakyStore{Store: db.store}
	fs.fails.Store(o.failClaims)
	g, err := idem.New(fs, &idem.Config{Logger: quiet})
	require.NoError(t, err)
	b := &clientBundle{started: make(chan struct{}, 16), now: time.Now()}
	if o.block {
		b.block = make(chan struct{})
	}
	h := func(ctx context.Context, _ string, req proto.Message) (proto.Message, error) {
		n := b.runs.Add(1)
		b.started <- struct{}{}
		if b.block != nil {
			select {
			case <-b.block:
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		}
		return structpb.NewStruct(map[string]any{"charge": float64(n),
			"amount": req.(*structpb.Struct).GetFields()["amount"].GetNumberValue()})
	}
	lis := &trackingListener{Listener: bufconn.Listen(1 << 20)}
	var n atomic.Int32
	record := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		enc, err := proto.MarshalOptions{Deterministic: true}.Marshal(req.(proto.Message))
		require.NoError(t, err)
		resp, rerr := next(ctx, req)
		c := call{key: metadata.ValueFromIncomingContext(ctx, grpcidem.MetadataKey), bytes: enc}
		for _, d := range status.Convert(rerr).Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				c.delay = ri.GetRetryDelay().AsDuration()
			}
		}
		b.mu.Lock()
		b.calls = append(b.calls, c)
		b.mu.Unlock()
		if o.drop != nil && o.drop(int(n.Add(1))) {
			lis.closeAll() // the answer is stored; the client never gets it
		}
		return resp, rerr
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(record, grpcidem.UnaryServerInterceptor(g, scopeFromMetadata, nil)))
	srv.RegisterService(&paymentsDesc, &paymentsServer{h: h})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	dial := func(opts ...grpc.DialOption) *grpc.ClientConn {
		conn, err := grpc.NewClient("passthrough:///bufnet", append([]grpc.DialOption{
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
			grpc.WithTransportCredentials(insecure.NewCredentials()),
		}, opts...)...)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	b.plain = dial()
	ic := grpcidem.UnaryClientInterceptorWithClock(o.config, func() time.Time {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.now
	}, func(ctx context.Context, d time.Duration) error {
		b.mu.Lock()
		b.sleeps = append(b.sleeps, d)
		b.now = b.now.Add(d)
		n := len(b.sleeps)
		b.mu.Unlock()
		if b.onSleep != nil {
			b.onSleep(n)
		}
		return ctx.Err()
	})
	b.guarded = dial(grpc.WithChainUnaryInterceptor(ic))
	return b
}

// chargeGuarded calls Charge as user-1 through the client interceptor, with
// key in the metadata unless it is empty.
func (b *clientBundle) chargeGuarded(ctx context.Context, key string, req *structpb.Struct) (*structpb.Struct, idemclient.Result, error) {
	ctx = metadata.AppendToOutgoingContext(ctx, "x-user", "user-1")
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, grpcidem.MetadataKey, key)
	}
	var res idemclient.Result
	out := new(structpb.Struct)
	err := b.guarded.Invoke(ctx, methodCharge, req, out, grpcidem.WithResult(&res))
	return out, res, err
}

// requireSameCalls requires n calls at the server, all with key and the
// bytes of req.
func (b *clientBundle) requireSameCalls(t *testing.T, n int, key string, req *structpb.Struct) {
	t.Helper()
	want, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	require.NoError(t, err)
	b.mu.Lock()
	defer b.mu.Unlock()
	require.Len(t, b.calls, n)
	for i, c := range b.calls {
		require.Equal(t, []string{key}, c.key, "call %d", i+1)
		require.Equal(t, want, c.bytes, "call %d", i+1)
	}
}

func (b *clientBundle) slept() []time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]time.Duration(nil), b.sleeps...)
}

func (b *clientBundle) delayOf(t *testing.T, n int) time.Duration {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	require.Greater(t, len(b.calls), n-1)
	return b.calls[n-1].delay
}

// The connection breaks after the server stored the answer: the client
// gets Unavailable, retries with the same key and message, and gets the
// stored answer. The charge ran once.
func TestClientDroppedAfterCommitIsReplayed(t *testing.T) {
	b := setupClient(t, clientSetup{drop: func(n int) bool { return n == 1 }})
	req := order(t, 42)
	out, res, err := b.chargeGuarded(t.Context(), "", req)
	require.NoError(t, err)
	require.EqualValues(t, 1, out.GetFields()["charge"].GetNumberValue())
	require.True(t, res.Replayed)
	require.Equal(t, 2, res.Attempts)
	require.NotEmpty(t, res.Key)
	require.EqualValues(t, 1, b.runs.Load(), "exactly one execution")
	b.requireSameCalls(t, 2, res.Key, req)
	require.Len(t, b.slept(), 1)
}

// A retry that finds the first call running is refused Aborted
// (REQUEST_IN_PROGRESS), waits its RetryInfo, and gets the stored answer.
func TestClientInProgressThenReplay(t *testing.T) {
	b := setupClient(t, clientSetup{block: true})
	key := newKey()
	first := make(chan result, 1)
	go func() { first <- charge(t, b.plain, "user-1", key, order(t, 42)) }()
	<-b.started

	b.onSleep = func(int) {
		close(b.block)
		r := <-first // answered once its answer is stored
		require.NoError(t, r.err)
	}
	out, res, err := b.chargeGuarded(t.Context(), key, order(t, 42))
	require.NoError(t, err)
	require.EqualValues(t, 1, out.GetFields()["charge"].GetNumberValue())
	require.Equal(t, idemclient.Result{Key: key, Replayed: true, Attempts: 2}, res)
	require.EqualValues(t, 1, b.runs.Load())
	// The server answers the retry (call 1, the Aborted) before the first
	// call (call 2) returns; its RetryInfo is the wait.
	wait := b.delayOf(t, 1)
	require.Positive(t, wait)
	require.Equal(t, []time.Duration{wait}, b.slept())
	b.requireSameCalls(t, 3, key, order(t, 42))
}

// The same key with another message is FailedPrecondition: never retried.
func TestClientKeyReusedIsNotRetried(t *testing.T) {
	b := setupClient(t, clientSetup{})
	key := newKey()
	require.NoError(t, charge(t, b.plain, "user-1", key, order(t, 42)).err)
	_, res, err := b.chargeGuarded(t.Context(), key, order(t, 43))
	requireRefusal(t, err, codes.FailedPrecondition, grpcidem.ReasonKeyReused)
	require.Equal(t, idemclient.Result{Key: key, Attempts: 1}, res)
	require.Empty(t, b.slept())
	require.EqualValues(t, 1, b.runs.Load())
}

// PostgreSQL unreachable for the first attempt: Unavailable with RetryInfo;
// the client waits exactly that, and the retry runs the charge.
func TestClientUnavailableHonoursRetryInfo(t *testing.T) {
	b := setupClient(t, clientSetup{failClaims: 1})
	key := newKey()
	_, res, err := b.chargeGuarded(t.Context(), key, order(t, 42))
	require.NoError(t, err)
	require.Equal(t, idemclient.Result{Key: key, Attempts: 2}, res)
	wait := b.delayOf(t, 1)
	require.GreaterOrEqual(t, wait, 2*time.Second, "the store's hint: 2s plus jitter")
	require.Equal(t, []time.Duration{wait}, b.slept())
	require.EqualValues(t, 1, b.runs.Load())
	b.requireSameCalls(t, 2, key, order(t, 42))
}

// A key that stays in progress: the retries end before a wait that would
// outlast the deadline, with DeadlineExceeded.
func TestClientDeadlineEndsTheRetries(t *testing.T) {
	b := setupClient(t, clientSetup{block: true, config: &grpcidem.ClientConfig{
		Retry: idemclient.Retry{MaxAttempts: 100, MaxElapsed: time.Hour}}})
	t.Cleanup(func() { close(b.block) })
	key := newKey()
	go func() { charge(t, b.plain, "user-1", key, order(t, 42)) }()
	<-b.started

	deadline := time.Now().Add(time.Minute)
	b.mu.Lock()
	b.now = deadline.Add(-5 * time.Second)
	b.mu.Unlock()
	ctx, cancel := context.WithDeadline(t.Context(), deadline)
	defer cancel()
	_, res, err := b.chargeGuarded(ctx, key, order(t, 42))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, codes.DeadlineExceeded, status.Code(err))
	require.Contains(t, err.Error(), "code = Aborted", "it names the last status")
	require.NotContains(t, err.Error(), "\n")
	require.Equal(t, key, res.Key)
	slept := b.slept()
	require.Equal(t, len(slept)+1, res.Attempts)
	require.GreaterOrEqual(t, res.Attempts, 2)
	var total time.Duration
	for _, d := range slept {
		total += d
	}
	require.Less(t, total, 5*time.Second)
	require.EqualValues(t, 1, b.runs.Load())
}

// The deadline passes while an attempt waits for its answer.
func TestClientDeadlineDuringAnAttempt(t *testing.T) {
	b := setupClient(t, clientSetup{block: true}) // never closed: runs until the client leaves
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, res, err := b.chargeGuarded(ctx, "", order(t, 42))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, codes.DeadlineExceeded, status.Code(err))
	require.Equal(t, 1, res.Attempts)
	require.NotEmpty(t, res.Key)
}

// A key the server would refuse is refused before anything is sent; a
// method not guarded passes through without a key.
func TestClientKeyInvalidAndUnguarded(t *testing.T) {
	b := setupClient(t, clientSetup{config: &grpcidem.ClientConfig{
		Methods: func(m string) bool { return m == methodCharge }}})
	for _, key := range []string{"a,b", " lead", string(make([]byte, idem.MaxKeyLen+1))} {
		_, _, err := b.chargeGuarded(t.Context(), key, order(t, 42))
		require.ErrorIs(t, err, grpcidem.ErrKeyInvalid, "%q", key)
	}
	two := metadata.AppendToOutgoingContext(t.Context(), grpcidem.MetadataKey, "k1", grpcidem.MetadataKey, "k2")
	_, _, err := b.chargeGuarded(two, "", order(t, 42))
	require.ErrorIs(t, err, grpcidem.ErrKeyInvalid)
	b.mu.Lock()
	require.Empty(t, b.calls, "nothing sent")
	b.mu.Unlock()

	// Balance is not guarded by the client: no key is added, and the
	// server (which guards every method) refuses it as missing, once.
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-user", "user-1")
	err = b.guarded.Invoke(ctx, methodBalance, wrapperspb.String("acct_1"), new(wrapperspb.StringValue))
	requireRefusal(t, err, codes.InvalidArgument, grpcidem.ReasonKeyMissing)
	require.Empty(t, b.slept())
}

func TestClientInterceptorPanicsOnMisuse(t *testing.T) {
	require.PanicsWithValue(t, "grpcidem: ClientConfig.Retry.MaxDelay -1ns must not be negative", func() {
		grpcidem.UnaryClientInterceptor(&grpcidem.ClientConfig{Retry: idemclient.Retry{MaxDelay: -1}})
	})
}

// withInfo is a status with the server interceptor's ErrorInfo and, when
// delay is positive, a RetryInfo.
func withInfo(t *testing.T, code codes.Code, reason, domain string, delay time.Duration) error {
	t.Helper()
	st := status.New(code, "refused")
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: domain}}
	if delay > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
	}
	st, err := st.WithDetails(details...)
	require.NoError(t, err)
	return st.Err()
}

// TestClientWhatIsRetried walks the interceptor's table with a scripted
// invoker: each case's errors are returned in turn, and the interceptor
// must stop at the first final one.
func TestClientWhatIsRetried(t *testing.T) {
	d := grpcidem.ErrorDomain
	for name, tc := range map[string]struct {
		errs     func(t *testing.T) []error
		attempts int
		sleeps   []time.Duration
	}{
		"OK": {func(*testing.T) []error { return []error{nil} }, 1, nil},
		"in progress, OK": {func(t *testing.T) []error {
			return []error{withInfo(t, codes.Aborted, grpcidem.ReasonInProgress, d, time.Second), nil}
		}, 2, []time.Duration{time.Second}},
		"pending, OK": {func(t *testing.T) []error {
			return []error{withInfo(t, codes.Aborted, grpcidem.ReasonPending, d, 3*time.Second), nil}
		}, 2, []time.Duration{3 * time.Second}},
		"unavailable without details, OK": {func(*testing.T) []error {
			return []error{status.Error(codes.Unavailable, "connection closed"), nil}
		}, 2, nil},
		"a handler's Aborted": {func(*testing.T) []error { return []error{status.Error(codes.Aborted, "tx conflict")} }, 1, nil},
		"in progress of another domain": {func(t *testing.T) []error {
			return []error{withInfo(t, codes.Aborted, grpcidem.ReasonInProgress, "example.com", time.Second)}
		}, 1, nil},
		"key reused": {func(t *testing.T) []error {
			return []error{withInfo(t, codes.FailedPrecondition, grpcidem.ReasonKeyReused, d, 0)}
		}, 1, nil},
		"key invalid": {func(t *testing.T) []error {
			return []error{withInfo(t, codes.InvalidArgument, grpcidem.ReasonKeyInvalid, d, 0)}
		}, 1, nil},
		"internal": {func(*testing.T) []error { return []error{status.Error(codes.Internal, "boom")} }, 1, nil},
		"five unavailable: the last": {func(*testing.T) []error {
			u := status.Error(codes.Unavailable, "down")
			return []error{u, u, u, u, u, nil}
		}, 5, nil},
	} {
		t.Run(name, func(t *testing.T) {
			errs := tc.errs(t)
			var keys []string
			invoker := func(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
				md, _ := metadata.FromOutgoingContext(ctx)
				keys = append(keys, md.Get(grpcidem.MetadataKey)...)
				return errs[len(keys)-1]
			}
			var sleeps []time.Duration
			ic := grpcidem.UnaryClientInterceptorWithClock(nil, time.Now, func(_ context.Context, d time.Duration) error {
				sleeps = append(sleeps, d)
				return nil
			})
			var res idemclient.Result
			err := ic(t.Context(), methodCharge, order(t, 1), new(structpb.Struct), nil, invoker, grpcidem.WithResult(&res))
			require.Equal(t, errs[tc.attempts-1], err, "the last attempt's result")
			require.Len(t, keys, tc.attempts)
			for _, k := range keys {
				require.Equal(t, res.Key, k, "one key, set once")
			}
			require.Equal(t, tc.attempts, res.Attempts)
			require.Len(t, sleeps, tc.attempts-1)
			if tc.sleeps != nil {
				require.Equal(t, tc.sleeps, sleeps)
			}
		})
	}
}
