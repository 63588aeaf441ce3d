package idem

import "strings"

// wrapError is an error of the Guard that says what kind of failure it is (one
// of the package's sentinels) and keeps its cause, without naming a layer
// twice: "idem: store unavailable: durable: claim: <the driver's text>", not
// "idem: claim: idem: store unavailable: durable: claim: ...". The cause
// (a store's error) names its own operation. errors.Is and errors.As reach
// both the kind and the cause.
type wrapError struct {
	op    string // the Guard's own operation when the cause does not name it ("complete"), or ""
	kind  error  // a sentinel such as ErrUnavailable, or nil
	cause error
}

func (e *wrapError) Error() string {
	var b strings.Builder
	b.WriteString("idem: ")
	if e.op != "" {
		b.WriteString(e.op)
		b.WriteString(": ")
	}
	if e.kind != nil {
		b.WriteString(strings.TrimPrefix(e.kind.Error(), "idem: "))
		if e.cause == nil {
			return b.String()
		}
		b.WriteString(": ")
	}
	if e.cause != nil {
		b.WriteString(strings.TrimPrefix(e.cause.Error(), "idem: "))
	}
	return b.String()
}

func (e *wrapError) Unwrap() []error {
	errs := make([]error, 0, 2)
	if e.kind != nil {
		errs = append(errs, e.kind)
	}
	if e.cause != nil {
		errs = append(errs, e.cause)
	}
	return errs
}
