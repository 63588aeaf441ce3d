package reconcile

import "time"

// Tuning is what a test changes of a Reconciler; a zero field keeps the
// Reconciler's own.
type Tuning struct {
	BatchSize                                             int
	ResolveTimeout, BackoffBase, BackoffMax, StoreTimeout time.Duration
	OnResult                                              func(res Result, took time.Duration, err error)
}

// Tune applies t to r, before it runs.
func Tune(r *Reconciler, t Tuning) *Reconciler {
	if t.BatchSize != 0 {
		r.cfg.BatchSize = t.BatchSize
	}
	for _, f := range []struct{ to, from *time.Duration }{
		{&r.cfg.ResolveTimeout, &t.ResolveTimeout}, {&r.cfg.BackoffBase, &t.BackoffBase},
		{&r.cfg.BackoffMax, &t.BackoffMax}, {&r.cfg.StoreTimeout, &t.StoreTimeout},
	} {
		if *f.from != 0 {
			*f.to = *f.from
		}
	}
	if t.OnResult != nil {
		r.cfg.OnResult = t.OnResult
	}
	return r
}
