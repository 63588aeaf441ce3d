package idem

import (
	"sync"
	"time"
)

// repeatInterval is how often a failure of one cause is logged while it
// repeats: once, then at most once per interval with the count of the
// lines held back meanwhile.
const repeatInterval = 10 * time.Second

// maxRepeatCauses bounds the causes a repeatLog remembers; past it, it
// forgets them all and starts again (logging each cause's next line).
const maxRepeatCauses = 64

// repeatLog decides which lines of a repeated failure are logged, so that an
// outage of PostgreSQL logs one line per cause and interval instead of one
// per refused request. Its zero value is ready; it is safe for concurrent
// use.
type repeatLog struct {
	mu     sync.Mutex
	causes map[string]*repeated
}

type repeated struct {
	logged time.Time // when its last line was logged
	held   int       // lines held back since
}

// allow reports whether a line of cause is logged at now, and when it is,
// how many lines of the same cause were held back since the last one.
func (r *repeatLog) allow(cause string, now time.Time) (log bool, held int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.causes[cause]
	switch {
	case !ok:
		if r.causes == nil || len(r.causes) >= maxRepeatCauses {
			r.causes = make(map[string]*repeated)
		}
		r.causes[cause] = &repeated{logged: now}
		return true, 0
	case now.Sub(c.logged) < repeatInterval:
		c.held++
		return false, 0
	}
	held, c.logged, c.held = c.held, now, 0
	return true, held
}
