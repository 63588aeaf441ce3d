package idem

import (
	"context"
	"sync"
	"time"
)

// bounded is context.WithDeadline(parent, deadline) whose timer starts only
// when somebody asks for Done. Every first execution bounds three calls (the
// claim, the work, the answer write); a store or a handler that never waits
// on Done (an in-memory store, a handler that does not block) then costs no
// timer and no allocation beyond the bounded itself, which an execution
// embeds. A caller that waits (pgx does, on every query) gets a real timer
// context from its first Done, with the same deadline: the bound is the
// same either way.
//
// Err reports the deadline from the clock until Done has been asked for, so
// a call that only polls Err sees it expire on time; once Err reports an
// error it never changes, and Done, asked for later, is already closed.
//
// A bounded is used by one call and ended by end once the call returns; it
// must not be reused.
type bounded struct {
	parent   context.Context
	deadline time.Time

	mu     sync.Mutex
	err    error              // latched: once set, it never changes
	inner  context.Context    // context.WithDeadline(parent, deadline), made by the first Done
	cancel context.CancelFunc // inner's
}

// start bounds parent at d, or at parent's own deadline if that comes first
// (as context.WithDeadline does).
func (c *bounded) start(parent context.Context, d time.Time) {
	c.parent, c.deadline = parent, d
	if pd, ok := parent.Deadline(); ok && pd.Before(d) {
		c.deadline = pd
	}
}

// end releases the timer, if one was started: the call is over.
func (c *bounded) end() { c.endAt(time.Time{}) }

// endAt is end for a caller that has just read the clock for its own needs:
// now, unless zero, is the time the call returned, and spares end reading
// the clock again to tell an expired deadline from a call that returned in
// time.
func (c *bounded) endAt(now time.Time) {
	c.mu.Lock()
	cancel := c.cancel
	if c.err == nil && cancel == nil {
		c.err = c.expiredAt(now)
		if c.err == nil {
			c.err = context.Canceled
		}
	}
	c.mu.Unlock()
	if cancel != nil {
		cancel() // outside mu: cancelling reaches children, which may ask c for values
		c.mu.Lock()
		if c.err == nil {
			c.err = c.inner.Err()
		}
		c.mu.Unlock()
	}
}

// expired is the error of a bounded without a timer: its parent's, or
// DeadlineExceeded once the deadline has passed. c.mu is held.
func (c *bounded) expired() error { return c.expiredAt(time.Time{}) }

// expiredAt is expired at now, or, when now is zero, at the clock's time.
func (c *bounded) expiredAt(now time.Time) error {
	if err := c.parent.Err(); err != nil {
		return err
	}
	if now.IsZero() {
		now = time.Now()
	}
	if !now.Before(c.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

func (c *bounded) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *bounded) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inner == nil {
		c.inner, c.cancel = context.WithDeadline(c.parent, c.deadline)
		if c.err != nil {
			// Ended or expired before anybody waited: an expired deadline or
			// a done parent has already closed inner; an ended call has not.
			c.cancel()
		}
	}
	return c.inner.Done()
}

func (c *bounded) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		if c.inner != nil {
			c.err = c.inner.Err()
		} else {
			c.err = c.expired()
		}
	}
	return c.err
}

// Value is the parent's, or, once a timer context exists, that context's, so
// that a context derived from c (and context.Cause) finds the timer
// context's cancellation.
func (c *bounded) Value(key any) any {
	c.mu.Lock()
	inner := c.inner
	c.mu.Unlock()
	if inner != nil {
		return inner.Value(key)
	}
	return c.parent.Value(key)
}
