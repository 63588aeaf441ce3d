package pgidem

import (
	"sync"

	"github.com/idemguard/idem/durable"
)

// waiter is the Guard's Waiter. New must give the Guard one, but the
// Listener behind it exists only while Run runs: a subscription made before
// the Listener listens is handed over to it once it does (and woken then,
// since announcements made meanwhile were missed); once Run has stopped, a
// subscriber is woken at once, as by a closed Listener, and re-reads its key.
type waiter struct {
	mu      sync.Mutex
	l       *durable.Listener      // while it listens
	early   map[*earlySub]struct{} // made before it listened
	stopped bool                   // Run has ended
	done    chan struct{}          // closed when Run ends: forwarders return
	forward sync.WaitGroup         // the forwarders of early subscriptions
}

// earlySub is a subscription made before the Listener listened.
type earlySub struct {
	scope, key string
	ch         chan struct{} // what the Guard waits on
	cancelled  chan struct{} // closed by the Guard's cancel
	once       sync.Once
}

func newWaiter() *waiter {
	return &waiter{early: map[*earlySub]struct{}{}, done: make(chan struct{})}
}

// Subscribe implements idem.Waiter.
func (w *waiter) Subscribe(scope, key string) (<-chan struct{}, func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.l != nil {
		return w.l.Subscribe(scope, key)
	}
	e := &earlySub{scope: scope, key: key, ch: make(chan struct{}, 1), cancelled: make(chan struct{})}
	if w.stopped {
		e.ch <- struct{}{} // nothing will announce the key any more
		return e.ch, func() {}
	}
	w.early[e] = struct{}{}
	return e.ch, func() {
		w.mu.Lock()
		delete(w.early, e)
		w.mu.Unlock()
		e.once.Do(func() { close(e.cancelled) })
	}
}

// attach puts l behind the Waiter and hands the early subscriptions over to
// it.
func (w *waiter) attach(l *durable.Listener) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.l = l
	for e := range w.early {
		delete(w.early, e)
		wake, cancel := l.Subscribe(e.scope, e.key)
		notify(e.ch)
		w.forward.Go(func() {
			defer cancel()
			for {
				select {
				case <-wake:
					notify(e.ch)
				case <-e.cancelled:
					return
				case <-w.done:
					return
				}
			}
		})
	}
}

// stop detaches the Listener, wakes every early subscriber and waits for the
// forwarders. Safe to call more than once.
func (w *waiter) stop() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	w.stopped = true
	w.l = nil
	close(w.done)
	for e := range w.early {
		notify(e.ch)
	}
	w.mu.Unlock()
	w.forward.Wait()
}

// notify wakes ch without blocking: one pending wake-up is kept.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
