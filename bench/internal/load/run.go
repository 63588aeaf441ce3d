package load

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Step is one rung of the ladder: a fixed offered rate for a fixed time.
type Step struct {
	// Rate is the offered load in arrivals per second. Must be positive.
	Rate float64
	// Duration is how long arrivals are scheduled: Rate*Duration arrivals
	// in all. Must be positive.
	Duration time.Duration
	// MaxInFlight caps concurrent requests: arrivals beyond it wait for a
	// free slot, and that wait counts in their latency. Must be positive.
	MaxInFlight int
	// Drain is how long, after Duration, arrivals that are late are still
	// issued and requests in flight may finish. Past it, arrivals not yet
	// issued are dropped and the context of the requests still in flight is
	// cancelled. Defaults to Duration.
	Drain time.Duration
}

func (s Step) validate() error {
	switch {
	case !(s.Rate > 0):
		return fmt.Errorf("load: Step.Rate %v must be positive", s.Rate)
	case s.Duration <= 0:
		return fmt.Errorf("load: Step.Duration %v must be positive", s.Duration)
	case s.MaxInFlight < 1:
		return fmt.Errorf("load: Step.MaxInFlight %d must be positive", s.MaxInFlight)
	case s.Drain < 0:
		return fmt.Errorf("load: Step.Drain %v must not be negative", s.Drain)
	}
	return nil
}

// Arrivals returns the number of arrivals the step schedules.
func (s Step) Arrivals() int64 { return int64(s.Rate * s.Duration.Seconds()) }

// Intended returns the intended start of arrival i of a step at rate that
// starts at start: start + i/rate, computed without accumulating rounding.
func Intended(start time.Time, rate float64, i int64) time.Time {
	return start.Add(time.Duration(float64(i) * float64(time.Second) / rate))
}

// Op performs the request of arrival i. It returns a short name of what
// happened (e.g. "executed", "replayed"), and an error when the request
// failed; a failed request is counted as an error whatever its name.
type Op func(ctx context.Context, i int64) (outcome string, err error)

// Result is what one step measured.
type Result struct {
	Step Step
	// Scheduled is the number of arrivals the step meant to send.
	Scheduled int64
	// Issued arrivals were handed to a worker; Dropped ones (Scheduled -
	// Issued) were still waiting when the drain ended, or when ctx ended.
	Issued, Dropped int64
	// Completed requests returned, with or without an error; Errors of
	// them failed.
	Completed, Errors int64
	// Outcomes counts completed requests by the name their Op returned
	// (failed ones under "error").
	Outcomes map[string]int64
	// Latency runs from each arrival's intended start to its completion:
	// what a client that sent it on time waited. Service runs from when a
	// worker started it: the request's own duration, without the queueing.
	Latency, Service *Histogram
	// Elapsed runs from the first intended start to the last completion,
	// and is at least Duration.
	Elapsed time.Duration
	// Interrupted reports that ctx ended before the step did.
	Interrupted bool
	// FirstErr is the first error an Op returned, for diagnosis.
	FirstErr error

	// start is the intended start of arrival 0: arrival i was due at
	// Intended(start, Step.Rate, i).
	start time.Time
}

// Offered returns the offered rate in arrivals per second.
func (r *Result) Offered() float64 { return r.Step.Rate }

// Achieved returns the throughput: requests that completed without error
// per second of Elapsed.
func (r *Result) Achieved() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Completed-r.Errors) / r.Elapsed.Seconds()
}

// ErrorRate returns the share of scheduled arrivals that failed or were
// dropped.
func (r *Result) ErrorRate() float64 {
	if r.Scheduled == 0 {
		return 0
	}
	return float64(r.Errors+r.Dropped) / float64(r.Scheduled)
}

type arrival struct {
	i  int64
	at time.Time
}

// Run drives one step open-loop: arrival i is due at Intended(start, Rate, i)
// whatever happened to the arrivals before it, and is handed to one of
// MaxInFlight workers, which calls op. When every worker is busy the
// dispatcher waits, but the intended times do not move, so the wait is
// charged to the latency of the arrivals that suffered it.
//
// When ctx ends, no more arrivals are issued, the requests in flight see
// their context cancelled, and Run returns what was measured, with
// Interrupted set.
func Run(ctx context.Context, s Step, op Op) (*Result, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	if s.Drain == 0 {
		s.Drain = s.Duration
	}
	res := &Result{
		Step:      s,
		Scheduled: s.Arrivals(),
		Outcomes:  make(map[string]int64),
		Latency:   NewHistogram(),
		Service:   NewHistogram(),
	}
	opCtx, cancelOps := context.WithCancel(ctx)
	defer cancelOps()

	var (
		wg       sync.WaitGroup
		mu       sync.Mutex   // guards res.Outcomes, res.Errors, res.FirstErr
		lastDone atomic.Int64 // latest completion, in ns since start
		done     atomic.Int64
	)
	ch := make(chan arrival)
	// start carries a monotonic clock reading, and so do the intended
	// times and the completion offsets derived from it: a step of the wall
	// clock during the run does not move them.
	start := time.Now().Add(time.Millisecond)
	res.start = start
	for range s.MaxInFlight {
		wg.Go(func() {
			local := make(map[string]int64)
			var errs int64
			var first error
			for a := range ch {
				began := time.Now()
				outcome, err := op(opCtx, a.i)
				end := time.Now()
				res.Latency.Record(end.Sub(a.at))
				res.Service.Record(end.Sub(began))
				done.Add(1)
				for since := int64(end.Sub(start)); ; {
					last := lastDone.Load()
					if since <= last || lastDone.CompareAndSwap(last, since) {
						break
					}
				}
				if err != nil {
					errs++
					if first == nil {
						first = err
					}
					outcome = "error"
				}
				local[outcome]++
			}
			mu.Lock()
			defer mu.Unlock()
			for k, v := range local {
				res.Outcomes[k] += v
			}
			res.Errors += errs
			if res.FirstErr == nil {
				res.FirstErr = first
			}
		})
	}

	drainCtx, cancelDrain := context.WithDeadline(ctx, start.Add(s.Duration+s.Drain))
	defer cancelDrain()
	sleep := time.NewTimer(0)
	<-sleep.C
	issued := int64(0)
dispatch:
	for ; issued < res.Scheduled; issued++ {
		at := Intended(start, s.Rate, issued)
		if d := time.Until(at); d > 0 {
			sleep.Reset(d)
			select {
			case <-sleep.C:
			case <-ctx.Done():
				break dispatch
			}
		}
		select {
		case ch <- arrival{i: issued, at: at}:
		case <-drainCtx.Done():
			break dispatch
		}
	}
	close(ch)
	res.Issued = issued
	res.Dropped = res.Scheduled - issued

	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-drainCtx.Done():
		cancelOps()
		<-finished
	}
	res.Completed = done.Load()
	res.Interrupted = ctx.Err() != nil
	res.Elapsed = max(s.Duration, time.Duration(lastDone.Load()))
	if res.Completed == 0 {
		res.Elapsed = s.Duration
	}
	return res, nil
}

// ErrSaturated is returned by [Limits.Check] when a step shows that the
// system could not keep up with its offered load.
var ErrSaturated = errors.New("load: saturated")

// Limits say when a step shows saturation; the ladder of a target stops at
// its first saturated step.
type Limits struct {
	// MinAchieved is the least acceptable ratio of achieved to offered
	// throughput. Defaults to 0.9.
	MinAchieved float64
	// MaxErrorRate is the largest acceptable share of failed and dropped
	// arrivals. Defaults to 0.01.
	MaxErrorRate float64
	// MaxP99 is the largest acceptable p99 latency. Defaults to 0: no limit.
	MaxP99 time.Duration
}

// Check returns nil when r is within the limits, else an error wrapping
// ErrSaturated that says which limit was crossed.
func (l Limits) Check(r *Result) error {
	if l.MinAchieved == 0 {
		l.MinAchieved = 0.9
	}
	if l.MaxErrorRate == 0 {
		l.MaxErrorRate = 0.01
	}
	if a, o := r.Achieved(), r.Offered(); a < l.MinAchieved*o {
		return fmt.Errorf("%w: achieved %.0f/s < %.0f%% of offered %.0f/s", ErrSaturated, a, 100*l.MinAchieved, o)
	}
	if e := r.ErrorRate(); e > l.MaxErrorRate {
		return fmt.Errorf("%w: %.1f%% errors or drops > %.1f%%", ErrSaturated, 100*e, 100*l.MaxErrorRate)
	}
	if p := r.Latency.Quantile(0.99); l.MaxP99 > 0 && p > l.MaxP99 {
		return fmt.Errorf("%w: p99 %v > %v", ErrSaturated, p.Round(time.Microsecond), l.MaxP99)
	}
	return nil
}

// SortedOutcomes returns the outcome names of r in order.
func (r *Result) SortedOutcomes() []string { return slices.Sorted(maps.Keys(r.Outcomes)) }
