package durable

import "time"

// limit is a batcher's limit on its kind's statements in flight: a request
// that finds it reached waits for one of them (batch.go). It follows the
// statements' latency by the rule of TCP Vegas. A statement's latency, set
// against the least latency lately seen (what a statement takes when none
// waits), tells how many of the statements that were in flight with it
// waited at the server rather than being served:
//
//	queued = inFlight × (1 − least/latency)
//
// While more than limitQueued of them did, the limit falls, to one below
// what was in flight; while fewer than limitIdle did, it rises by one. It
// never falls below limitQueued: a limit that low is never reached with
// more than that many queued. So on a server that serves every statement at
// once the limit stays out of reach and every request goes alone, and on
// one whose CPU, locks or disk hold statements back, the requests beyond
// the limit share statements instead of adding to the queue: the commits in
// flight are enough to keep the server busy, and no more than that wait
// their turn in it.
//
// The least latency is the least of the current window's and the last
// one's, each limitWindow long, so that it follows a server that moved
// further away within two windows. Only statements that succeeded count: an
// error can come back faster than any statement is served.
//
// The zero value allows any number. Its methods are called with the
// batcher's lock held.
type limit struct {
	n      int              // statements allowed in flight; 0: any
	least  [2]time.Duration // the least latency of the current window and the last; 0: none seen
	window time.Time        // when the current window began
}

const (
	// limitQueued is how many statements may wait at the server before the
	// limit falls; it is also the least the limit falls to.
	limitQueued = 4
	// limitIdle is how few statements waiting let the limit rise.
	limitIdle = 2
	// limitWindow is how long a window of the least latency lasts.
	limitWindow = 10 * time.Second
)

// allows reports whether a statement may go with running already in flight.
func (l *limit) allows(running int) bool {
	return l.n == 0 || running < l.n
}

// observe takes the latency of a statement that succeeded at now, sent with
// inFlight statements of the kind in flight, itself included.
func (l *limit) observe(now time.Time, latency time.Duration, inFlight int) {
	if latency <= 0 {
		return
	}
	if now.Sub(l.window) >= limitWindow { // the first window begins with the first statement
		l.least[1], l.least[0], l.window = l.least[0], 0, now
	}
	if l.least[0] == 0 || latency < l.least[0] {
		l.least[0] = latency
	}
	least := l.least[0]
	if l.least[1] != 0 && l.least[1] < least {
		least = l.least[1]
	}
	queued := float64(inFlight) * (1 - float64(least)/float64(latency))
	switch {
	case queued > limitQueued:
		below := inFlight
		if l.n != 0 {
			below = min(l.n, inFlight)
		}
		l.n = max(limitQueued, below-1)
	case queued < limitIdle && l.n != 0:
		l.n++
	}
}
