// Package pgidem wires idem for production over PostgreSQL: one constructor
// over a *pgxpool.Pool gives the Guard, and one [Service.Run] runs what a
// production setup needs beside it (the reconciler, the expiry sweeper and,
// when requests wait, the Listener) until its context ends.
//
//	svc, err := pgidem.New(pool, resolve, nil) // Config.Guard.Lock set: the hybrid strategy
//	if err != nil { ... }
//	go svc.Run(ctx) // on every instance: one at a time reconciles and sweeps
//	mux.Handle("POST /orders", svc.Guard().Middleware(scope, nil)(createOrder))
//
// It replaces wiring by hand: durable.New, idem.New, durable.NewListener,
// reconcile.New and durable.NewSweeper, and a goroutine each for the
// Listener, the reconciler and the sweeper. Migrations stay a step of their
// own, run at start-up before the Service serves: durable.Migrate with the
// same Config.Store.
//
// The name follows grpcidem: <what it is over>idem. The root package idem
// holds the Guard and stays free of any driver, so that a program using the
// in-memory store links no pgx; what needs pgx lives here, as river keeps its
// pgx driver in riverpgxv5.
//
// Every part keeps its own Config type (idem.Config, durable.Config,
// reconcile.Config), so each knob has one name and one default. The Guard's
// Logger and MeterProvider serve every part unless the store's Config names
// its own. New adds the checks that span parts and fails, naming the field,
// on a setup that would misbehave only later: waiting (idem.Config.Wait)
// without the store announcing answers (durable.Config.Notify).
package pgidem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/reconcile"
)

// Config configures a [Service]. A nil *Config is valid and gives every
// default: the table strategy (the hybrid with Guard.Lock), keys kept 24h,
// reconciliation every 30s, an hourly sweep, no waiting. Each part keeps its
// own Config type; New copies them and never changes the caller's.
type Config struct {
	// Store configures the PostgreSQL store: the schema (run durable.Migrate
	// with the same Config), the retention, Notify. Its Logger and
	// MeterProvider default to the Guard's. Defaults to durable's defaults.
	Store *durable.Config
	// Guard configures the Guard: its Lock (a *lock.Locker) selects the
	// hybrid strategy. With Wait and no Waiter, New gives the Guard one, kept
	// behind a Listener (one connection of the pool) that Run keeps; that
	// needs Store.Notify on every instance that writes the table. Its Logger
	// and MeterProvider serve every part. Defaults to idem's defaults.
	Guard *idem.Config
	// Reconcile configures the reconciler that Run starts; it logs and
	// measures through the Guard. Defaults to reconcile's defaults (every
	// 30s, MinAge 1m).
	Reconcile *reconcile.Config
}

// Service is a Guard over PostgreSQL (and Redis, for the hybrid strategy)
// with the services that keep its keys moving: the reconciler, the expiry
// sweeper and, when the Guard waits, the Listener. Its methods are safe for
// concurrent use; [Service.Run] runs at most once.
type Service struct {
	guard      *idem.Guard
	store      *durable.Store
	reconciler *reconcile.Reconciler
	sweeper    *durable.Sweeper
	waiter     *waiter // nil unless New gave the Guard its Waiter
	ran        atomic.Bool

	mu      sync.Mutex
	shut    bool               // Shutdown has begun: Run starts nothing
	stopRun context.CancelFunc // ends the Run under way, if any
	runDone chan struct{}      // closed when that Run returns
}

// New returns a Service over pool. resolve is what the reconciler asks about
// a key a 5xx or a crash left in progress; it is required, since such a key
// answers 409 until it is settled or released. A nil cfg gives every default.
//
// New contacts neither PostgreSQL nor Redis. Every invalid field, and every
// combination that would misbehave later, is an error naming the field.
func New(pool *pgxpool.Pool, resolve reconcile.ResolveFunc, cfg *Config) (*Service, error) {
	if pool == nil {
		return nil, errors.New("pgidem: nil pool")
	}
	if resolve == nil {
		return nil, errors.New("pgidem: nil ResolveFunc: a key a 5xx left in progress answers 409 until the reconciler settles or releases it")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	storeCfg := copyOf(c.Store)
	guardCfg := copyOf(c.Guard)
	recCfg := copyOf(c.Reconcile)

	if guardCfg.Wait > 0 && guardCfg.Waiter == nil && !storeCfg.Notify {
		return nil, fmt.Errorf("pgidem: Config.Guard.Wait %v needs Config.Store.Notify: without announcements every waiting retry waits its whole bound, then gets 409", guardCfg.Wait)
	}
	if guardCfg.Logger == nil {
		guardCfg.Logger = slog.Default()
	}
	if storeCfg.Logger == nil {
		storeCfg.Logger = guardCfg.Logger // the Sweeper's and the Listener's
	}
	if storeCfg.MeterProvider == nil {
		storeCfg.MeterProvider = guardCfg.MeterProvider // the Sweeper's
	}
	store, err := durable.New(pool, &storeCfg)
	if err != nil {
		return nil, fmt.Errorf("pgidem: Config.Store: %w", err)
	}
	s := &Service{store: store}
	if guardCfg.Wait > 0 && guardCfg.Waiter == nil {
		s.waiter = newWaiter()
		guardCfg.Waiter = s.waiter
	}
	s.guard, err = idem.New(store, &guardCfg)
	if err != nil {
		return nil, fmt.Errorf("pgidem: Config.Guard: %w", err)
	}
	s.reconciler, err = reconcile.New(s.guard, store, resolve, &recCfg)
	if err != nil {
		return nil, fmt.Errorf("pgidem: Config.Reconcile: %w", err)
	}
	s.sweeper, err = durable.NewSweeper(store)
	if err != nil {
		return nil, fmt.Errorf("pgidem: %w", err)
	}
	return s, nil
}

// Guard returns the Guard: its Middleware guards HTTP handlers, Do a queue
// consumer's work, and grpcidem's interceptor a gRPC service; idem.Complete
// joins a handler's transaction through it.
func (s *Service) Guard() *idem.Guard { return s.guard }

// Run runs the reconciler, the sweeper and, when New gave the Guard its
// Waiter, the Listener, on every instance (each of the reconciler and the
// sweeper takes a lease row of the table, durable.Store.Lead, so one
// instance at a time does the work),
// until ctx ends. Call it once, after durable.Migrate.
//
// A failed round of the reconciler or the sweeper (PostgreSQL unreachable,
// say) does not stop Run: it is logged (Error) and counted in the metrics,
// and the next round comes at the next interval; the Listener reconnects by
// itself, and until it listens the requests that wait are woken once it does.
// When ctx ends, Run stops them all (the key or batch in hand is finished, the
// leases are given back, the Listener's connection is closed), waits for
// them, and returns nil. It returns an error when it is called a second time,
// or when a service stopped on its own, after stopping the others.
func (s *Service) Run(ctx context.Context) error {
	if !s.ran.CompareAndSwap(false, true) {
		return errors.New("pgidem: Service.Run called more than once")
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	s.mu.Lock()
	if s.shut {
		s.mu.Unlock()
		return nil
	}
	s.stopRun, s.runDone = stop, make(chan struct{})
	defer close(s.runDone)
	s.mu.Unlock()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	start := func(name string, run func(context.Context) error) {
		wg.Go(func() {
			if err := run(ctx); err != nil {
				once.Do(func() { first = fmt.Errorf("pgidem: %s: %w", name, err) })
				stop()
			}
		})
	}
	if s.waiter != nil {
		start("listener", s.listen)
	}
	start("reconciler", s.reconciler.Run)
	start("sweeper", s.sweeper.Run)
	wg.Wait()
	return first
}

// Shutdown stops the Service for a clean exit: it stops Run as the end of
// its context would (a Run not started yet starts nothing) and waits for it
// to return, so that a key the reconciler settles meanwhile gets its copy in
// the lease; then it is Guard().Shutdown: requests claim without a lease
// from then on, and the answers' copies still queued for Redis are sent and
// answered. It returns once all that is done, or when ctx ends first, with
// an error wrapping ctx.Err(). Call it once the server has stopped taking
// requests, and before closing the Redis client and the pool. It is safe to
// call more than once.
func (s *Service) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.shut = true
	stop, done := s.stopRun, s.runDone
	s.mu.Unlock()
	if stop != nil {
		stop()
		select {
		case <-done:
		case <-ctx.Done():
			return fmt.Errorf("pgidem: shutdown: waiting for Run to return: %w", ctx.Err())
		}
	}
	return s.guard.Shutdown(ctx)
}

// listen keeps a Listener behind the Guard's Waiter until ctx ends.
func (s *Service) listen(ctx context.Context) error {
	defer s.waiter.stop()
	l, err := durable.NewListener(ctx, s.store)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it listened
		}
		return err
	}
	s.waiter.attach(l)
	<-ctx.Done()
	s.waiter.stop() // before Close: no new subscription on a closed Listener
	return l.Close()
}

func copyOf[T any](p *T) T {
	var v T
	if p != nil {
		v = *p
	}
	return v
}
