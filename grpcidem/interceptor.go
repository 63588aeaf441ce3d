package grpcidem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemguard/idem"
)

// ScopeFunc returns the authenticated caller of a call (for example the user
// id that an authentication interceptor chained before this one stored in
// ctx). It reports false when the call is not authenticated; the interceptor
// then refuses it with codes.Unauthenticated and never falls back to a
// shared namespace.
type ScopeFunc func(ctx context.Context) (scope string, ok bool)

// Config tunes [UnaryServerInterceptor]. A nil *Config is valid: every
// default.
type Config struct {
	// Methods reports which unary methods are guarded, given the full
	// method name ("/package.Service/Method"); others pass through
	// untouched. Defaults to every unary method.
	//
	// WARNING: with the default, every unary method on the server needs a
	// key, health checks (/grpc.health.v1.Health/Check) and reads included.
	// Name the methods that have effects, e.g.
	//
	//	guarded := map[string]bool{"/shop.v1.Checkout/Pay": true, "/shop.v1.Checkout/Refund": true}
	//	cfg := &grpcidem.Config{Methods: func(m string) bool { return guarded[m] }}
	Methods func(fullMethod string) bool
	// OptionalKey lets calls without the key's metadata entry through,
	// unguarded. Defaults to false: they are refused with
	// codes.InvalidArgument.
	OptionalKey bool
	// Fingerprint replaces how a request is fingerprinted, for example to
	// leave out a field that a client changes on every retry (a send time),
	// or for messages that are not protobuf. An error refuses the call with
	// codes.Internal before the handler runs. Defaults to [Fingerprint].
	Fingerprint FingerprintFunc
	// Render sends a stored answer that is not in Answer's form (see
	// RenderFunc). Answers in Answer's form are always sent as they are
	// stored. Defaults to nil: such an answer gets codes.Internal.
	Render RenderFunc
}

// RenderFunc turns a stored answer that is not in Answer's form into the
// result of a call to fullMethod, as its handler would have returned it: a
// response message, or an error whose gRPC code is a final answer (see
// Answer). Such answers are those a service keeps in one form for every
// transport: what a reconcile.ResolveFunc settles a key with, or what a
// handler passes to idem.Complete, for example an HTTP status with a JSON
// body. Any other result (an error that is not a status, a code that is
// not final, a response that is not a proto.Message) means the answer
// cannot be rendered: the call gets codes.Internal and the cause is logged.
// It is called on every call that gets such an answer, from many
// goroutines at once.
type RenderFunc func(fullMethod string, stored idem.Response) (resp any, err error)

type interceptor struct {
	g           *idem.Guard
	scope       ScopeFunc
	match       func(string) bool
	optional    bool
	fingerprint FingerprintFunc
	log         *slog.Logger
	render      RenderFunc
}

// UnaryServerInterceptor returns a gRPC unary server interceptor that runs
// each guarded call's handler at most once per (scope, idempotency key) and
// answers every retry with the stored result. It is safe for concurrent use
// and may be chained after an authentication interceptor
// (grpc.ChainUnaryInterceptor) whose result scope reads.
//
// For each guarded call (every unary method unless Config.Methods says
// otherwise) it asks scope for the caller, reads the key from the request
// metadata ("idempotency-key": exactly one value of 1 to 255 characters of
// printable ASCII, no comma, no leading or trailing space) and fingerprints
// the full method name with the request message (see Fingerprint). The
// handler receives the guard's work context: idem.ExecutionFromContext,
// idem.MarkRetrySafe and grpc.SetHeader work on it.
//
// The handler's result decides what retries get (the package documentation
// has the table): a response message or an error with a final code
// (InvalidArgument, NotFound, ...) is stored and replayed, with the response
// header "idempotent-replayed: true"; ResourceExhausted and Unimplemented
// release the key; any other code leaves the key in progress, so retries get
// codes.Aborted until it is settled (idem.Guard.Settle, a reconciler) or
// released. The first call gets the handler's own result, unless the
// handler stored another answer with idem.Complete: then it gets the stored
// one, as every retry does. A stored answer in Answer's form is sent as
// stored; any other is rendered by Config.Render. A retry of a running call
// waits for its answer when the Guard's Config.Wait says so.
//
// Refusals carry a google.rpc.ErrorInfo detail (ErrorDomain, a Reason*
// constant): Aborted while the key is in progress (REQUEST_IN_PROGRESS,
// RetryInfo 1s) or waits for reconciliation (REQUEST_PENDING, RetryInfo
// 30s), FailedPrecondition for a key reused with another request,
// InvalidArgument for a missing or invalid key, Unauthenticated without a
// caller, Unavailable when the store cannot decide (the handler did not run:
// retry with the same key; RetryInfo 2s). Internal error text never reaches
// the client: it goes to the logger.
//
// WARNING: an answer that cannot be stored (not a proto.Message, larger than
// idem.DefaultMaxBody in its encoding) is delivered but its key stays in
// progress, exactly like an Internal error. Only the response message or
// status is stored: header and trailer metadata the handler sets are not
// replayed.
//
// UnaryServerInterceptor panics if g or scope is nil.
func UnaryServerInterceptor(g *idem.Guard, scope ScopeFunc, cfg *Config) grpc.UnaryServerInterceptor {
	if g == nil || scope == nil {
		panic("grpcidem: UnaryServerInterceptor needs a Guard and a ScopeFunc")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	ic := &interceptor{
		g:           g,
		scope:       scope,
		match:       c.Methods,
		optional:    c.OptionalKey,
		fingerprint: c.Fingerprint,
		render:      c.Render,
		log:         g.Logger(), // what a client is not told: the Guard's Config.Logger
	}
	if ic.fingerprint == nil {
		ic.fingerprint = Fingerprint
	}
	return ic.intercept
}

func (ic *interceptor) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if ic.match != nil && !ic.match(info.FullMethod) {
		return handler(ctx, req)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get(MetadataKey)
	if len(values) == 0 && ic.optional {
		return handler(ctx, req)
	}
	scope, ok := ic.scope(ctx)
	if !ok || scope == "" {
		return nil, ic.refuse(ctx, info.FullMethod, idem.OutcomeNone, &idem.RequestError{Field: "Scope", Reason: "no authenticated caller"})
	}
	key, err := parseKey(values)
	if err != nil {
		return nil, ic.refuse(ctx, info.FullMethod, idem.OutcomeNone, err)
	}
	fp, err := ic.fingerprint(info.FullMethod, req)
	if err != nil {
		ic.log.LogAttrs(ctx, slog.LevelError, "grpcidem: request not fingerprinted; refused",
			slog.String("method", info.FullMethod), slog.Any("error", err))
		return nil, status.Error(codes.Internal, "The request could not be processed.")
	}
	r := idem.Request{Scope: scope, Key: key, Fingerprint: fp}

	var out any
	var herr error
	var own idem.Response // the stored form of the handler's result, when it has one
	stored, outcome, err := ic.g.Do(ctx, r, func(wctx context.Context) (idem.Response, error) {
		out, herr = handler(wctx, req)
		var derr error
		own, derr = disposition(out, herr, idem.DefaultMaxBody)
		return own, derr
	})
	switch outcome {
	case idem.OutcomeExecuted:
		if stored.Equal(own) {
			return out, herr
		}
		// The key took another answer than the handler returned: the one
		// the handler committed through idem.Complete. The caller gets what
		// every retry gets.
		return ic.send(ctx, info.FullMethod, r, stored, false)
	case idem.OutcomeExecutedReleased:
		return out, herr
	case idem.OutcomeExecutedUnstored:
		if err != nil && !errors.Is(err, errNotFinal) {
			// Not a choice of the handler: an answer it meant as final
			// could not be stored.
			ic.log.LogAttrs(ctx, slog.LevelWarn, "grpcidem: answer delivered but not stored; key left in progress",
				slog.String("method", info.FullMethod), slog.String("key_hash", idem.KeyHash(scope, key)), slog.Any("error", err))
		}
		return out, herr
	case idem.OutcomeReplayed:
		return ic.send(ctx, info.FullMethod, r, stored, true)
	}
	// Refused: the handler did not run.
	if re := (*idem.RequestError)(nil); errors.As(err, &re) && re.Field == "Scope" {
		// The ScopeFunc returned an identity the guard cannot key on (too
		// long, not UTF-8): the caller is not usable.
		ic.log.LogAttrs(ctx, slog.LevelWarn, "grpcidem: ScopeFunc returned an unusable scope", slog.String("reason", re.Reason))
	}
	return nil, ic.refuse(ctx, info.FullMethod, outcome, err)
}

// send returns the result a stored answer stands for: decoded when it is in
// Answer's form, else rendered by the RenderFunc, with the replayed header
// when it replays an earlier execution's. An answer neither can read is
// codes.Internal, its cause logged.
func (ic *interceptor) send(ctx context.Context, method string, r idem.Request, a idem.Response, replayed bool) (any, error) {
	resp, rpcErr, err := ic.decode(method, a)
	if err != nil {
		ic.log.LogAttrs(ctx, slog.LevelError, "grpcidem: stored answer cannot be read",
			slog.String("method", method), slog.String("key_hash", idem.KeyHash(r.Scope, r.Key)), slog.Any("error", err))
		return nil, status.Error(codes.Internal, "The stored answer to this request could not be read.")
	}
	if replayed {
		_ = grpc.SetHeader(ctx, metadata.Pairs(MetadataReplayed, "true")) // fails only outside a server call
	}
	return resp, rpcErr
}

// decode turns a stored answer back into the handler's result (see replay),
// through the RenderFunc when it is not in Answer's form.
func (ic *interceptor) decode(method string, a idem.Response) (resp any, rpcErr error, err error) {
	if ic.render == nil || a.Header.Get(headerType) != "" {
		return replay(a)
	}
	resp, rpcErr = ic.render(method, a)
	code := status.Code(rpcErr)
	if _, final := finalStatus[code]; !final {
		return nil, nil, fmt.Errorf("grpcidem: Config.Render rendered a stored answer of status %d as code %s, not a final answer: %v", a.Status, code, rpcErr)
	}
	if m, ok := resp.(proto.Message); code == codes.OK && (!ok || resp == nil || !m.ProtoReflect().IsValid()) {
		return nil, nil, fmt.Errorf("grpcidem: Config.Render rendered a stored answer of status %d as %T, not a non-nil proto.Message", a.Status, resp)
	}
	return resp, rpcErr, nil
}

// refuse returns the status of the refusal that idem.Classify makes of
// outcome and err (never an answered one): the code, the ErrorInfo reason
// and the RetryInfo of its kind, with a message worded for gRPC. When the
// call's own context has ended, the guard could not decide because of it:
// the client gets the context's code (Canceled, DeadlineExceeded) instead
// of Unavailable.
func (ic *interceptor) refuse(ctx context.Context, method string, outcome idem.Outcome, err error) error {
	d := idem.Classify(outcome, err)
	r := refusals[d.Slug]
	var meta map[string]string
	switch d.Slug {
	case idem.ProblemKeyMissing:
		r.msg = "Send an " + MetadataKey + " metadata entry with a unique value (e.g. a UUID) per intent."
		meta = map[string]string{"metadata_key": MetadataKey}
	case idem.ProblemKeyInvalid:
		r.msg = "The " + MetadataKey + " metadata entry is invalid."
		if ke := (*idem.KeyError)(nil); errors.As(err, &ke) {
			r.msg = "The " + MetadataKey + " metadata entry is invalid: " + ke.Reason + "."
		}
		meta = map[string]string{"metadata_key": MetadataKey}
	case idem.ProblemServiceUnavailable:
		if cerr := ctx.Err(); cerr != nil {
			return status.FromContextError(cerr).Err()
		}
		if !errors.Is(err, idem.ErrUnavailable) { // the Guard logs those
			ic.log.LogAttrs(ctx, slog.LevelError, "grpcidem: request refused, store unavailable",
				slog.String("method", method), slog.Any("error", err))
		}
	}
	return refusal(r.code, r.reason, r.msg, d.RetryAfter, meta)
}
