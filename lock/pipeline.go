package lock

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxBatch is the most commands one pipeline carries; more wait for the next.
const maxBatch = 256

// pipeline sends a Locker's commands, at most one exchange with Redis at a
// time. A command that finds nothing in flight goes out at once from its
// caller's goroutine, as a plain command or with the writes of later that
// wait for an exchange to ride with (a copy rides with the next request's
// lease instead of costing an exchange, a goroutine and wake-ups of its
// own): one caller alone pays one round trip per command. Commands that
// arrive while an exchange is out queue, and go together as one pipeline
// when it returns (unless they are only writes of later, which wait on), in
// the order they arrived, as a database groups the commits that queue
// behind a flush. Under load this is most of what the lease costs: one
// round trip's system calls and wake-ups on both sides serve many commands,
// so that the hybrid's lease is cheap beside the PostgreSQL statement it
// saves.
//
// Each caller waits for its own command at most until its context ends; a
// command whose caller has gone by the time its batch is sent is not sent.
// A command queued with later has no caller waiting: it goes with the next
// exchange a caller waits for (when none comes within defaultLinger, one of
// its own with the writes queued meanwhile), and its callback learns how it
// went.
// A pipeline's exchange is bounded by the Locker's Timeout and runs under a
// context of its own: the values of its callers' contexts (a trace span, say)
// reach go-redis's hooks only for a command sent alone.
type pipeline struct {
	client  redis.UniversalClient
	timeout time.Duration
	scripts []*redis.Script // loaded again when Redis has lost them

	mu      sync.Mutex
	busy    bool          // an exchange is out: newcomers queue
	pending []*call       // queued, in arrival order
	closed  bool          // shut down: newcomers are refused
	idle    chan struct{} // closed when busy turns false, for shutdown
	linger  time.Duration // defaultLinger; longer in tests
	timer   *time.Timer   // sends the writes queued while idle, after linger
}

// call is one caller's command, or commands. queue adds them to c, a client
// (sent at once) or a pipeline (sent by Exec), and returns the one whose
// error is the call's; n is how many it adds, and a call of more than one
// always goes as a pipeline, so that they share one round trip.
type call struct {
	ctx   context.Context
	n     int
	queue func(ctx context.Context, c redis.Cmdable) redis.Cmder
	cmd   redis.Cmder
	err   error
	done  chan struct{} // closed once answered, for a caller waiting in do

	// A call queued with later: nobody waits for it. answered, when not
	// nil, is called with its error. A call still queued at expires (the
	// end of what it writes) is dropped and answered nil; one still queued
	// at giveUp (the Locker's Timeout after it was queued) is dropped and
	// answered errNotSent, as a caller waiting that long would have given up.
	answered        func(error)
	expires, giveUp time.Time
}

// errShutDown answers a call made once the Locker has been shut down.
var errShutDown = errors.New("the Locker is shut down")

// errNotSent answers a call queued with later that waited its Timeout behind
// exchanges that did not return.
var errNotSent = errors.New("not sent within the timeout: the exchanges before it did not return")

// do sends the n commands that queue adds, in one round trip, and returns
// the one queue returns with its error (redis.Nil for a nil reply), or ctx's
// error when ctx ended first; the commands may still have reached Redis then.
func (p *pipeline) do(ctx context.Context, n int, queue func(context.Context, redis.Cmdable) redis.Cmder) (redis.Cmder, error) {
	c := &call{ctx: ctx, n: n, queue: queue}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errShutDown
	}
	if !p.busy {
		// Nothing is out: c goes at once from this goroutine, behind the
		// writes that wait for an exchange to ride with.
		p.busy = true
		n := min(len(p.pending), maxBatch-1)
		riders := p.pending[:n:n]
		p.pending = p.pending[n:]
		if p.timer != nil && len(riders) > 0 {
			p.timer.Stop() // if it fires all the same, it finds nothing to send
		}
		p.mu.Unlock()
		if len(riders) == 0 {
			p.send(ctx, []*call{c})
			p.next(true)
			return c.cmd, c.err
		}
		// Riders that must go again have waited already: they go at once.
		p.next(!p.carry(ctx, riders, c))
		return c.cmd, c.err
	}
	c.done = make(chan struct{})
	p.pending = append(p.pending, c)
	p.mu.Unlock()
	select {
	case <-c.done:
		return c.cmd, c.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// defaultLinger is how long a write queued with later waits for another
// command's exchange to ride with before it goes with the writes queued
// meanwhile (at once when they fill a batch). While the hybrid leases
// first, a copy rides the next request's lease; while it claims first, no
// lease is taken and the copies go by themselves: 10ms sends those of 3,200
// first executions a second about 33 to a round trip, where 1ms sent them 3
// or 4 (BenchmarkLeaseCost, path=copy: half the CPU per copy on each side).
// A copy that waits delays only another instance's replay of its key, which
// gets 409 and Retry-After meanwhile: this Locker's own later commands go
// after it.
const defaultLinger = 10 * time.Millisecond

// later queues c without waiting for it: it goes out with the next exchange,
// after every command queued before it and before every command queued
// after it. That exchange is the next command's, or, if none comes within
// linger (or a batch's worth of writes queue first), one of the pipeline's
// own.
func (p *pipeline) later(c *call) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.err = errShutDown
		c.finish()
		return
	}
	p.pending = append(p.pending, c)
	if !p.busy {
		switch {
		case len(p.pending) >= maxBatch:
			p.flushIn(0) // a full batch: waiting longer saves nothing
		case len(p.pending) == 1:
			p.flushIn(p.linger)
		}
	}
	p.mu.Unlock()
}

// flushIn has flush run after d. p.mu must be held.
func (p *pipeline) flushIn(d time.Duration) {
	if p.timer == nil {
		p.timer = time.AfterFunc(d, p.flush)
		return
	}
	p.timer.Reset(d)
}

// flush sends the writes that waited linger with nothing out.
func (p *pipeline) flush() {
	p.mu.Lock()
	if p.busy || len(p.pending) == 0 { // an exchange took them
		p.mu.Unlock()
		return
	}
	p.busy = true
	p.mu.Unlock()
	p.drain(p.take(false))
}

// carry sends c with the writes that waited for an exchange (riders), in
// one round trip under c's context, from c's caller's goroutine. Should that
// context end first, the riders go again with the next exchange, ahead of
// what was queued since: an exchange its caller left is not the writes'
// failure, and sending a write twice writes the same value. carry reports
// whether some go again.
func (p *pipeline) carry(ctx context.Context, riders []*call, c *call) (again bool) {
	live := p.live(riders)
	p.send(ctx, append(live, c))
	if ctx.Err() == nil {
		for _, r := range live {
			r.finish()
		}
		return false
	}
	resend := live[:0]
	for _, r := range live {
		if r.err == nil {
			r.finish()
			continue
		}
		r.cmd, r.err = nil, nil
		resend = append(resend, r)
	}
	p.mu.Lock()
	p.pending = append(resend, p.pending...)
	p.mu.Unlock()
	return len(resend) > 0
}

// next ends an exchange: the commands that queued meanwhile go out from a
// goroutine of their own, which keeps sending until nothing is queued but
// writes that may wait (see take; with linger false, those go too).
func (p *pipeline) next(linger bool) {
	if batch := p.take(linger); batch != nil {
		go p.drain(batch)
	}
}

// take returns the next batch, or nil and marks the pipeline idle. With
// linger, writes of later that queued while an exchange was out, with no
// caller waiting among them and fewer than a batch, are left to wait for
// the next command's exchange or the linger, as if they had come while
// nothing was out (but not after shutdown has begun).
func (p *pipeline) take(linger bool) []*call {
	p.mu.Lock()
	defer p.mu.Unlock()
	if linger && len(p.pending) > 0 && len(p.pending) < maxBatch && !p.closed && !slices.ContainsFunc(p.pending, waited) {
		p.busy = false
		p.flushIn(p.linger)
		return nil
	}
	if len(p.pending) == 0 {
		p.busy = false
		if p.idle != nil {
			close(p.idle)
			p.idle = nil
		}
		return nil
	}
	n := min(len(p.pending), maxBatch)
	batch := p.pending[:n:n]
	p.pending = p.pending[n:]
	if len(p.pending) == 0 {
		p.pending = nil
	}
	return batch
}

// shutdown refuses every command from now on and waits until those given
// before have been answered (sent, or dropped as their callers or their
// deadlines say), or ctx ends.
func (p *pipeline) shutdown(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	if !p.busy {
		if len(p.pending) == 0 {
			p.mu.Unlock()
			return nil
		}
		p.busy = true // writes wait to ride with an exchange: send them now
		n := min(len(p.pending), maxBatch)
		batch := p.pending[:n:n]
		p.pending = p.pending[n:]
		go p.drain(batch)
	}
	if p.idle == nil {
		p.idle = make(chan struct{})
	}
	idle := p.idle
	p.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// live returns the calls of batch still to send, and answers the others: a
// write past its ttl (nil) or its Timeout (errNotSent), a caller gone.
func (p *pipeline) live(batch []*call) []*call {
	live := batch[:0:0]
	now := time.Now()
	for _, c := range batch {
		switch {
		case c.answered != nil && c.expires.Sub(now) < time.Millisecond:
			c.answered(nil)
		case c.answered != nil && now.After(c.giveUp):
			c.err = errNotSent
			c.finish()
		case c.ctx.Err() != nil:
			c.err = c.ctx.Err()
			c.finish()
		default:
			live = append(live, c)
		}
	}
	return live
}

func (p *pipeline) drain(batch []*call) {
	for ; batch != nil; batch = p.take(true) {
		live := p.live(batch)
		if len(live) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
			p.send(ctx, live)
			cancel()
		}
		for _, c := range live {
			c.finish()
		}
	}
}

// waited reports whether a caller waits for c (a command of do, not a
// write of later).
func waited(c *call) bool { return c.answered == nil }

// finish hands c's result to whoever wants it.
func (c *call) finish() {
	if c.done != nil {
		close(c.done)
	}
	if c.answered != nil {
		c.answered(c.err)
	}
}

// send runs calls, one alone as a plain command, several as one pipeline,
// and loads the scripts again and resends the calls that found them missing
// (NOSCRIPT: Redis restarted, failed over, or its script cache was flushed).
func (p *pipeline) send(ctx context.Context, calls []*call) {
	p.exec(ctx, calls)
	var again []*call
	for _, c := range calls {
		if c.err != nil && c.err != redis.Nil && redis.HasErrorPrefix(c.err, "NOSCRIPT") {
			again = append(again, c)
		}
	}
	if len(again) == 0 {
		return
	}
	for _, s := range p.scripts {
		if err := s.Load(ctx, p.client).Err(); err != nil {
			return // the calls keep their NOSCRIPT error
		}
	}
	p.exec(ctx, again)
}

func (p *pipeline) exec(ctx context.Context, calls []*call) {
	if len(calls) == 1 && calls[0].n == 1 {
		c := calls[0]
		c.cmd = c.queue(ctx, p.client)
		c.err = c.cmd.Err()
		return
	}
	pipe := p.client.Pipeline()
	for _, c := range calls {
		c.cmd = c.queue(ctx, pipe)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	for _, c := range calls {
		c.err = c.cmd.Err()
	}
}
