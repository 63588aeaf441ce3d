package grpcidem

import (
	"errors"
	"fmt"
	"net/http"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemguard/idem"
)

// headerType names the protobuf message held in a stored answer's body: the
// handler's response message, or google.rpc.Status for a stored error.
const headerType = "Grpc-Message-Type"

var statusName = (&spb.Status{}).ProtoReflect().Descriptor().FullName()

// errNotFinal is what the work returns to leave its key in progress.
var errNotFinal = errors.New("grpcidem: not a final answer")

// finalStatus gives, for each code whose answer is final (stored and
// replayed to every retry), the HTTP-like status it is stored under: the
// grpc-gateway mapping, which keeps the guard's rule that 1xx-4xx except 429
// is stored.
var finalStatus = map[codes.Code]int{
	codes.OK:                 http.StatusOK,
	codes.InvalidArgument:    http.StatusBadRequest,
	codes.FailedPrecondition: http.StatusBadRequest,
	codes.OutOfRange:         http.StatusBadRequest,
	codes.Unauthenticated:    http.StatusUnauthorized,
	codes.PermissionDenied:   http.StatusForbidden,
	codes.NotFound:           http.StatusNotFound,
	codes.AlreadyExists:      http.StatusConflict,
}

// retrySafe codes declare that nothing happened: the key is released.
var retrySafe = map[codes.Code]bool{
	codes.ResourceExhausted: true,
	codes.Unimplemented:     true,
}

// Answer returns the stored form of a handler's result (resp, err): what the
// interceptor stores after a first execution, and what a reconciler passes
// to idem.Guard.Settle so that the next retry of a key left in progress is
// replayed this result.
//
// A nil err with a proto.Message resp is stored with the message's full
// name, resolved again on replay through protoregistry.GlobalTypes. An err
// whose gRPC code is a final answer (InvalidArgument, FailedPrecondition,
// OutOfRange, Unauthenticated, PermissionDenied, NotFound, AlreadyExists) is
// stored as its google.rpc.Status: code, message and details. Any other
// result cannot be stored and Answer returns an error: see the package
// documentation for what happens to such keys.
func Answer(resp any, err error) (idem.Response, error) {
	st := status.Convert(err) // OK for nil
	code := st.Code()
	httpStatus, final := finalStatus[code]
	if !final {
		return idem.Response{}, fmt.Errorf("%w: code %s", errNotFinal, code)
	}
	var m proto.Message
	if code == codes.OK {
		var ok bool
		if m, ok = resp.(proto.Message); !ok || resp == nil || !m.ProtoReflect().IsValid() {
			return idem.Response{}, fmt.Errorf("grpcidem: response %T is not a non-nil proto.Message", resp)
		}
	} else {
		m = st.Proto()
	}
	body, merr := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if merr != nil {
		return idem.Response{}, fmt.Errorf("grpcidem: marshal %T: %w", m, merr)
	}
	return idem.Response{
		Status: httpStatus,
		Header: http.Header{headerType: {string(m.ProtoReflect().Descriptor().FullName())}},
		Body:   body,
	}, nil
}

// disposition turns a handler's result into what the work returns to the
// guard: a stored answer, or an error that releases the key
// (idem.ErrRetrySafe) or leaves it in progress.
func disposition(resp any, err error, max int64) (idem.Response, error) {
	if c := status.Code(err); retrySafe[c] {
		return idem.Response{}, fmt.Errorf("grpcidem: code %s: %w", c, idem.ErrRetrySafe)
	}
	a, aerr := Answer(resp, err)
	if aerr != nil {
		return idem.Response{}, aerr
	}
	if int64(len(a.Body)) > max {
		return idem.Response{}, fmt.Errorf("%w: answer of %d bytes exceeds the %d-byte limit", errTooLarge, len(a.Body), max)
	}
	return a, nil
}

var errTooLarge = errors.New("grpcidem: answer not stored")

// replay turns a stored answer back into the handler's result: a message
// and a nil rpcErr, or a nil message and the stored status as rpcErr. err
// reports an answer that cannot be decoded.
func replay(a idem.Response) (resp any, rpcErr error, err error) {
	name := protoreflect.FullName(a.Header.Get(headerType))
	if name == statusName {
		var st spb.Status
		if err := proto.Unmarshal(a.Body, &st); err != nil {
			return nil, nil, fmt.Errorf("grpcidem: stored status: %w", err)
		}
		if st.GetCode() == int32(codes.OK) {
			return nil, nil, errors.New("grpcidem: stored status has code OK")
		}
		return nil, status.FromProto(&st).Err(), nil
	}
	if name == "" || !name.IsValid() {
		return nil, nil, fmt.Errorf("grpcidem: stored answer of status %d is not in Answer's form (no valid %s header): store gRPC answers with grpcidem.Answer, or render others with Config.Render", a.Status, headerType)
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(name)
	if err != nil {
		return nil, nil, fmt.Errorf("grpcidem: stored message type %s: %w", name, err)
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(a.Body, m); err != nil {
		return nil, nil, fmt.Errorf("grpcidem: stored %s: %w", name, err)
	}
	return m, nil, nil
}

// FingerprintFunc returns the fingerprint of a request to the method
// fullMethod ("/package.Service/Method"). A retry must get the same one, and
// two requests that should not share a key must get different ones, so
// include fullMethod (idem.HashParts does the encoding).
type FingerprintFunc func(fullMethod string, req any) (idem.Fingerprint, error)

// Fingerprint is the default FingerprintFunc: idem.HashParts over the full
// method name and the deterministic protobuf encoding of req (map entries
// sorted, unknown fields kept), so a retry of the same message gets the same
// fingerprint. It refuses a req that is not a proto.Message.
func Fingerprint(fullMethod string, req any) (idem.Fingerprint, error) {
	m, ok := req.(proto.Message)
	if !ok || req == nil {
		return idem.Fingerprint{}, fmt.Errorf("grpcidem: request %T is not a proto.Message; use Config.Fingerprint", req)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return idem.Fingerprint{}, fmt.Errorf("grpcidem: marshal request: %w", err)
	}
	return idem.HashParts([]byte(fullMethod), b), nil
}
