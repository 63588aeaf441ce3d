// Package periodic runs a job now and then again a fixed time after the end
// of each run, until its context ends: the loop shared by idem's sweeper and
// reconciler.
package periodic

import (
	"context"
	"sync/atomic"
	"time"
)

// Runner runs one job at a time. The zero value is ready to use.
type Runner struct {
	running atomic.Bool
}

// Run calls job at once, then interval after each call returns, until ctx
// ends; it returns nil then. A job that is running when ctx ends is waited
// for (it sees the cancelled ctx). It reports false, without running
// anything, when Run is already running on this Runner.
func (r *Runner) Run(ctx context.Context, interval time.Duration, job func(context.Context)) bool {
	if !r.running.CompareAndSwap(false, true) {
		return false
	}
	defer r.running.Store(false)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return true
		case <-timer.C:
		}
		if ctx.Err() != nil {
			return true
		}
		job(ctx)
		timer.Reset(interval)
	}
}
