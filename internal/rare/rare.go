// Package rare tells, from the latest requests, whether duplicates (requests
// whose key has been seen before) are rare: the rule by which the hybrid
// chooses between leasing and claiming first, and the Store between
// inserting and reading first.
package rare

import "sync/atomic"

// The default window and thresholds (docs/capacity.md says why).
const (
	Size  = 512
	Enter = Size / 50 // 2%
	Leave = Size / 20 // 5%
)

// Window counts requests and their duplicates, window by window. Duplicates
// become rare at the end of a window of size requests with at most enter
// duplicates, and stop being rare as soon as a window that found them rare
// has seen leave duplicates, without waiting for its end: about leave
// requests of a storm (and those already on their way) take the path for
// rare duplicates before the switch. The counts are approximate under
// concurrency (a window may lose a few requests at its end), which only
// moves a switch by a few requests. A new Window does not find duplicates
// rare.
type Window struct {
	rare       atomic.Bool
	seen, dups atomic.Int64 // in the current window

	size, enter, leave int64
}

// New returns a Window of size requests with the thresholds enter and leave
// (enter < leave <= size).
func New(size, enter, leave int64) *Window {
	return &Window{size: size, enter: enter, leave: leave}
}

// Rare reports whether duplicates are rare.
func (w *Window) Rare() bool { return w.rare.Load() }

// Observe counts a request, dup telling whether its key had been seen
// before, and reports whether it changed what Rare reports.
func (w *Window) Observe(dup bool) bool {
	d := w.dups.Load()
	if dup {
		d = w.dups.Add(1)
	}
	n := w.seen.Add(1)
	switched := false
	switch rare := w.rare.Load(); {
	case rare && d >= w.leave:
		switched = w.rare.CompareAndSwap(true, false)
	case n >= w.size:
		switched = !rare && d <= w.enter && w.rare.CompareAndSwap(false, true)
	default:
		return false
	}
	w.seen.Store(0)
	w.dups.Store(0)
	return switched
}

// Pin makes Rare report rare from now on, whatever the requests: for tests
// of one path, before the Window is in use.
func (w *Window) Pin(rare bool) {
	w.rare.Store(rare)
	w.size, w.enter, w.leave = 1<<62, -1, 1<<62
}
