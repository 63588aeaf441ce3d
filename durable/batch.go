package durable

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Group commit: a Store over a pool shares statements, and so commits and
// WAL flushes, among the claims (and, apart, the answer writes) that would
// otherwise queue, at the server or for a connection of the pool.
//
// A request goes at once, alone, in its caller's goroutine, with the one-key
// statement and the caller's context, unless a statement of its kind is in
// flight and either the Store's statements in flight take every connection
// of its pool or its kind's statements in flight have reached their limit
// (see limit): the limit falls while their latency shows them queueing at
// the server, and is out of reach while it does not. So a lone caller, and
// any load the server serves without queueing, pays exactly what it would
// without the batcher. A request held back waits in the batcher's queue;
// when one of the kind's statements returns, the queue (up to maxBatch
// requests, one per key) goes as one statement, one transaction, one flush,
// on the connection it gave back. So a request waits at most for one
// statement of its kind, and only where it would otherwise have queued, and
// once PostgreSQL is the bottleneck each statement serves many requests per
// commit.
//
// Every request gets its own key's result. A key is never twice in one
// statement: its second request waits for the next. A request whose
// context ends while it is queued leaves the queue and is never sent; one
// whose context ends while its statement runs returns the context's error,
// as a lone statement cut off would (its outcome is unknown to it). A
// statement refused by the server (a *pgconn.PgError: its transaction rolled
// back, nothing was written) is not the outcome of every request in it: each
// request then runs alone, so one request's fault stays its own.
type batcher[Req, Res any] struct {
	// exhausted reports whether every connection of the pool is taken by
	// the Store's statements in flight (busy).
	exhausted func() bool
	// busy counts the statements in flight of every batcher of the Store.
	busy *atomic.Int64
	// maxBatch bounds the requests in one statement.
	maxBatch int
	// key names a request's row: one request per key in a statement.
	key func(*Req) string
	// one runs one request alone, with its caller's context.
	one func(ctx context.Context, r *Req) (Res, error)
	// many runs reqs (at least two, distinct keys) as one statement. It
	// returns a result per request, in order, or the statement's error.
	many func(ctx context.Context, reqs []*Req) ([]Res, error)

	mu      sync.Mutex
	running int // statements of the kind in flight
	queue   []*call[Req, Res]
	limit   limit // on running, beside the pool's connections
}

// call is one request waiting for a statement.
type call[Req, Res any] struct {
	ctx  context.Context // the caller's: its deadline and values, read by the statement
	req  Req
	res  Res
	err  error
	done chan struct{} // closed once res and err are set
	// alone tells the caller to run its request alone after all: its
	// statement was refused by the server.
	alone bool
}

// batchMax is the most requests one statement serves.
const batchMax = 64

// do runs r, alone or with the requests waiting beside it.
func (b *batcher[Req, Res]) do(ctx context.Context, r Req) (Res, error) {
	b.mu.Lock()
	if b.running == 0 || (b.limit.allows(b.running) && !b.exhausted()) {
		b.running++
		inFlight := b.running
		b.busy.Add(1)
		b.mu.Unlock()
		sent := time.Now()
		res, err := b.one(ctx, &r)
		b.finished(sent, inFlight, err == nil)
		return res, err
	}
	c := &call[Req, Res]{ctx: ctx, req: r, done: make(chan struct{})}
	b.queue = append(b.queue, c)
	b.mu.Unlock()

	select {
	case <-c.done:
	case <-ctx.Done():
		b.mu.Lock()
		for i, q := range b.queue {
			if q == c { // still queued: never sent
				b.queue = append(b.queue[:i], b.queue[i+1:]...)
				b.mu.Unlock()
				var zero Res
				return zero, ctx.Err()
			}
		}
		b.mu.Unlock()
		// Taken into a statement: its outcome is unknown here, as a lone
		// statement's whose context ended.
		select {
		case <-c.done:
		default:
			var zero Res
			return zero, ctx.Err()
		}
	}
	if c.alone {
		return b.one(ctx, &c.req)
	}
	return c.res, c.err
}

// finished counts out a statement sent at sent with inFlight statements of
// the kind in flight (itself included), tells the limit its latency when it
// succeeded (ok), and sends the queue, if any, on the connection it gave
// back, in more than one statement while the limit allows.
func (b *batcher[Req, Res]) finished(sent time.Time, inFlight int, ok bool) {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if ok {
		b.limit.observe(now, now.Sub(sent), inFlight)
	}
	b.running--
	b.busy.Add(-1)
	for first := true; len(b.queue) > 0 && (first || b.limit.allows(b.running)); first = false {
		b.startLocked()
	}
}

// startLocked starts a statement for the queue, which is not empty. b.mu is
// held.
func (b *batcher[Req, Res]) startLocked() {
	batch := make([]*call[Req, Res], 0, min(len(b.queue), b.maxBatch))
	seen := make(map[string]struct{}, cap(batch))
	rest := b.queue[:0]
	for _, c := range b.queue {
		k := b.key(&c.req)
		if _, dup := seen[k]; dup || len(batch) == b.maxBatch {
			rest = append(rest, c)
			continue
		}
		seen[k] = struct{}{}
		batch = append(batch, c)
	}
	clear(b.queue[len(rest):])
	b.queue = rest
	b.running++
	b.busy.Add(1)
	go b.send(batch, b.running)
}

// send runs batch, hands every call its result, and counts the statement out;
// inFlight is as finished's.
func (b *batcher[Req, Res]) send(batch []*call[Req, Res], inFlight int) {
	sent := time.Now()
	if len(batch) == 1 {
		c := batch[0]
		c.res, c.err = b.one(c.ctx, &c.req)
		ok := c.err == nil
		close(c.done)
		b.finished(sent, inFlight, ok)
		return
	}
	ctx, cancel := batchContext(batch)
	defer cancel()
	reqs := make([]*Req, len(batch))
	for i, c := range batch {
		reqs[i] = &c.req
	}
	res, err := b.many(ctx, reqs)
	defer b.finished(sent, inFlight, err == nil)
	refused := rolledBack(err)
	for i, c := range batch {
		switch {
		case refused:
			c.alone = true
		case err != nil:
			c.err = err
		default:
			c.res = res[i]
		}
		close(c.done)
	}
}

// rolledBack reports whether err is the server's ERROR for a statement,
// which rolled back its implicit transaction: nothing it wrote is kept. A
// FATAL error (the backend ended, perhaps after its commit) and an error of
// the connection or the context leave the outcome unknown.
func rolledBack(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	if !ok {
		return false
	}
	severity := pgErr.SeverityUnlocalized
	if severity == "" {
		severity = pgErr.Severity
	}
	return severity == "ERROR"
}

// batchContext is the context of a statement that serves batch: it carries
// the first call's values, is cancelled by no caller alone (a caller that
// gives up returns without waiting), and ends with the latest of their
// deadlines, or never when one of them has none.
func batchContext[Req, Res any](batch []*call[Req, Res]) (context.Context, context.CancelFunc) {
	var last time.Time
	for _, c := range batch {
		d, ok := c.ctx.Deadline()
		if !ok {
			return context.WithCancel(context.WithoutCancel(batch[0].ctx))
		}
		if d.After(last) {
			last = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(batch[0].ctx), last)
}
