// Package clock lets a test move the monotonic clock that idem's background
// parts count durations on (the reconciler's wait before it acts on a key),
// through the context of a run: no package-level state, no exported option.
package clock

import (
	"context"
	"sync/atomic"
	"time"
)

type (
	nowKey       struct{}
	headStartKey struct{}
)

// With returns ctx carrying now as the clock of the runs started with it.
func With(ctx context.Context, now func() time.Time) context.Context {
	return context.WithValue(ctx, nowKey{}, now)
}

// Now reads the clock ctx carries, or time.Now (with its monotonic reading)
// when it carries none.
func Now(ctx context.Context) time.Time {
	if now, ok := ctx.Value(nowKey{}).(func() time.Time); ok {
		return now()
	}
	return time.Now()
}

// WithHeadStart returns ctx under which a run counts what it sees for the
// first time as seen d earlier: the test's stand-in for the minutes a key
// would wait on a real reconciler's clock, for a test that moved the key's
// row into the past on the database's clock.
func WithHeadStart(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, headStartKey{}, d)
}

// HeadStart is the head start ctx carries, 0 when none.
func HeadStart(ctx context.Context) time.Duration {
	d, _ := ctx.Value(headStartKey{}).(time.Duration)
	return d
}

// Offset is a clock for tests: time.Now moved on by what Advance added. Its
// zero value is time.Now. It is safe for concurrent use.
type Offset struct {
	d atomic.Int64
}

// Now returns time.Now plus every Advance so far.
func (o *Offset) Now() time.Time { return time.Now().Add(time.Duration(o.d.Load())) }

// Advance moves the clock on by d.
func (o *Offset) Advance(d time.Duration) { o.d.Add(int64(d)) }
