// Package retry paces and bounds the retries of one request: the loop shared
// by idem's HTTP client (idemclient) and its gRPC client interceptor
// (grpcidem). It decides when the next attempt may start, never whether an
// answer is worth retrying: that is the transport's.
package retry

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Policy bounds the retries of one request. A zero field takes its default.
// idemclient.Retry converts to it, so the two keep the same fields.
type Policy struct {
	MaxAttempts int           // attempts in all, the first included
	MaxElapsed  time.Duration // from the first attempt to the start of the last
	BaseDelay   time.Duration // the backoff's first ceiling
	MaxDelay    time.Duration // the backoff's largest ceiling
}

// The defaults of Policy.
const (
	DefaultMaxAttempts = 5
	DefaultMaxElapsed  = 30 * time.Second
	DefaultBaseDelay   = 200 * time.Millisecond
	DefaultMaxDelay    = 5 * time.Second
)

// WithDefaults returns p with each zero field set to its default. It returns
// an error naming the first negative field (as prefix.Field), and one when
// BaseDelay exceeds MaxDelay.
func (p Policy) WithDefaults(prefix string) (Policy, error) {
	switch {
	case p.MaxAttempts < 0:
		return p, fmt.Errorf("%s.MaxAttempts %d must not be negative", prefix, p.MaxAttempts)
	case p.MaxElapsed < 0:
		return p, fmt.Errorf("%s.MaxElapsed %v must not be negative", prefix, p.MaxElapsed)
	case p.BaseDelay < 0:
		return p, fmt.Errorf("%s.BaseDelay %v must not be negative", prefix, p.BaseDelay)
	case p.MaxDelay < 0:
		return p, fmt.Errorf("%s.MaxDelay %v must not be negative", prefix, p.MaxDelay)
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.MaxElapsed == 0 {
		p.MaxElapsed = DefaultMaxElapsed
	}
	if p.BaseDelay == 0 {
		p.BaseDelay = DefaultBaseDelay
	}
	if p.MaxDelay == 0 {
		p.MaxDelay = DefaultMaxDelay
	}
	if p.BaseDelay > p.MaxDelay {
		return p, fmt.Errorf("%s.BaseDelay %v must not exceed %s.MaxDelay %v", prefix, p.BaseDelay, prefix, p.MaxDelay)
	}
	return p, nil
}

// Clock is how a Call reads the time and waits; tests replace it.
type Clock struct {
	Now func() time.Time
	// Sleep waits d, or until ctx ends (then it returns ctx's error).
	Sleep func(ctx context.Context, d time.Duration) error
}

// RealClock is the wall clock and a timer.
var RealClock = Clock{Now: time.Now, Sleep: sleep}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ErrExhausted is Wait's error when MaxAttempts or MaxElapsed ends the
// retries: the transport then returns the last answer it got.
var ErrExhausted = errors.New("retries exhausted")

// Call is the retry state of one request. It is not safe for concurrent use.
type Call struct {
	p        Policy
	c        Clock
	start    time.Time
	attempts int
}

// Start begins a request's first attempt under p (with its defaults
// applied) and c.
func Start(p Policy, c Clock) *Call {
	return &Call{p: p, c: c, start: c.Now(), attempts: 1}
}

// Attempts is how many attempts have started.
func (c *Call) Attempts() int { return c.attempts }

// Wait is called after a failed attempt that may be retried. It waits
// before the next one: hint when it is positive (the server's Retry-After or
// RetryInfo, never shortened), otherwise a capped exponential backoff with
// full jitter, a random delay from 0 to min(MaxDelay, BaseDelay×2^(n-1))
// after the n-th attempt. It returns the delay it chose (or would have
// waited), and a nil error when the next attempt may start (and counts it); ErrExhausted, at once, when MaxAttempts attempts have
// started or the next one would start more than MaxElapsed after the first;
// and, at once, an error wrapping context.DeadlineExceeded when the next
// attempt would start after ctx's deadline, or ctx's error when ctx ends
// while it waits.
func (c *Call) Wait(ctx context.Context, hint time.Duration) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if c.attempts >= c.p.MaxAttempts {
		return 0, ErrExhausted
	}
	d := hint
	if d <= 0 {
		d = c.backoff()
	}
	at := c.c.Now().Add(d)
	if at.Sub(c.start) > c.p.MaxElapsed {
		return d, ErrExhausted
	}
	if deadline, ok := ctx.Deadline(); ok && !at.Before(deadline) {
		return d, fmt.Errorf("%w (the next attempt, %v away, would start after it)", context.DeadlineExceeded, d)
	}
	if err := c.c.Sleep(ctx, d); err != nil {
		return d, err
	}
	c.attempts++
	return d, nil
}

// backoff is the full-jitter delay after the current attempt.
func (c *Call) backoff() time.Duration {
	ceiling := c.p.MaxDelay
	if shift := c.attempts - 1; shift < 32 {
		if b := c.p.BaseDelay << shift; b > 0 && b < ceiling {
			ceiling = b
		}
	}
	return rand.N(ceiling + 1)
}

// Ended returns ctx's error, or context.DeadlineExceeded when ctx's deadline
// has passed but its timer has not fired yet: a transport that enforces the
// deadline itself (gRPC does) can fail an attempt a moment before ctx says
// so.
func Ended(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if deadline, ok := ctx.Deadline(); ok && !time.Now().Before(deadline) {
		return context.DeadlineExceeded
	}
	return nil
}
