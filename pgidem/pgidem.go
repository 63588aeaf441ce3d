// Package pgidem wires idem for production over PostgreSQL: one constructor
// over a *pgxpool.Pool and an optional Redis client gives the Guard, and one
// [Service.Run] runs what a production setup needs beside it (the reconciler,
// the expiry sweeper and, when requests wait, the Listener) until its context
// ends.
//
//	svc, err := pgidem.New(pool, rdb, resolve, nil) // rdb nil: the table strategy
//	if err != nil { ... }
//	go svc.Run(ctx) // on every instance: one at a time reconciles and sweeps
//	mux.Handle("POST /orders", svc.Middleware(scope, nil)(createOrder))
//
// It replaces wiring by hand: durable.New, lock.New, idem.New,
// durable.NewListener, reconcile.New and durable.NewSweeper, and a goroutine
// each for the Listener, the reconciler and the sweeper. Migrations stay a step of their own, run at start-up
// before the Service serves: durable.Migrate with the same Config.Store.
//
// The name follows grpcidem: <what it is over>idem. The root package idem
// holds the Guard and stays free of any driver, so that a program using the
// in-memory store links no pgx; what needs pgx (and go-redis) lives here, as
// river keeps its pgx driver in riverpgxv5. A newcomer who runs PostgreSQL
// looks for "pg" next to "idem".
//
// # What New checks
//
// Every part keeps its own Config type (idem.Config, durable.Config,
// lock.Config, reconcile.Config, durable.SweeperConfig), so each knob has one
// name and one default. New adds the checks that span parts and fails, naming
// the field, on a setup that would misbehave only later: waiting
// ([Config.Wait]) without the store announcing answers (durable.Config.Notify),
// a wait longer than any request can hold its key, a retention that a key
// waiting for reconciliation could outlive, a Lock or Waiter set by hand that
// New would replace, a lock configuration without a Redis client.
//
// # One Logger, one MeterProvider, one Retry-After
//
// The Guard's Logger and MeterProvider (Config.Guard) serve every part: the
// reconciler logs to the Guard's Logger, the Listener and the sweeper to the
// store's Config.Logger, which defaults to the Guard's, and their metrics
// come from the same MeterProvider. The Retry-After of a key pending
// reconciliation ([Service.RetryHints]) is derived from the reconciler's
// settings, and [Service.Middleware] sends it.
package pgidem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/lock"
	"github.com/idemguard/idem/reconcile"
)

// Config configures a [Service]. A nil *Config is valid and gives every
// default: the table strategy (the hybrid when New has a Redis client), keys
// kept 24h, reconciliation every 30s, an hourly sweep, no waiting. Each part
// keeps its own Config type; New copies them and never changes the caller's.
type Config struct {
	// Store configures the PostgreSQL store: the schema and table (run
	// durable.Migrate with the same Config), the retention, Notify. Defaults
	// to durable's defaults (durable.Config).
	Store *durable.Config
	// Guard configures the Guard. Its Lock and Waiter must be nil: New sets
	// them, the Lock from the Redis client and the Waiter from Wait. Its
	// Logger and MeterProvider serve every part (see the package doc).
	// Defaults to idem's defaults (idem.Config).
	Guard *idem.Config
	// Lock configures the Redis lease of the hybrid strategy; New refuses it
	// without a Redis client. Defaults to lock's defaults (lock.Config).
	Lock *lock.Config
	// Reconcile configures the reconciler that Run starts; it logs to the
	// Guard's Logger. Its MeterProvider must be nil (the Guard's
	// is used). Its MinAge and Interval set the Retry-After of a key
	// pending reconciliation (Service.RetryHints). Defaults to reconcile's
	// defaults (reconcile.Config: every 30s, MinAge 1m).
	Reconcile *reconcile.Config
	// Sweep configures the expiry sweeper that Run starts; it logs to
	// Store.Logger (the Guard's by default). Its MeterProvider must be nil
	// (the Guard's is used). Defaults to durable's defaults
	// (durable.SweeperConfig: hourly, in batches of 1000).
	Sweep *durable.SweeperConfig
	// Wait, when positive, lets a retry that finds its key running wait up to
	// Wait for the answer instead of being refused with 409: New gives the
	// Guard a Waiter, Run keeps a Listener (one connection of the pool)
	// behind it, and Service.Middleware waits (idem.MiddlewareConfig.Wait;
	// callers of Guard.Do pass idem.WaitFor(Wait)). It needs Store.Notify on
	// every instance that writes the table, and must be shorter than the
	// Guard's MaxHold. Keep it below the client's own timeout. Defaults to 0:
	// no request waits, no Listener.
	Wait time.Duration
}

// Service is a Guard over PostgreSQL (and Redis, for the hybrid strategy)
// with the services that keep its keys moving: the reconciler, the expiry
// sweeper and, with Config.Wait, the Listener. Its methods are safe for
// concurrent use; [Service.Run] runs at most once.
type Service struct {
	guard      *idem.Guard
	store      *durable.Store
	pool       *pgxpool.Pool
	reconciler *reconcile.Reconciler
	sweeper    *durable.Sweeper
	waiter     *waiter // nil without Config.Wait
	wait       time.Duration
	hints      idem.RetryHints
	ran        atomic.Bool

	mu      sync.Mutex
	shut    bool               // Shutdown has begun: Run starts nothing
	stopRun context.CancelFunc // ends the Run under way, if any
	runDone chan struct{}      // closed when that Run returns
}

// New returns a Service over pool, and over rdb (a *redis.Client,
// *redis.ClusterClient or *redis.Ring, set up as docs/configuration.md says
// for the lock: ContextTimeoutEnabled, no client-side retries) for the hybrid
// strategy, or nil for the table strategy. resolve is what the
// reconciler asks about a key a 5xx or a crash left in progress; it is
// required, since such a key answers 409 until it is settled or released. A
// nil cfg gives every default.
//
// New contacts neither PostgreSQL nor Redis. Every invalid field, and every
// combination that would misbehave later, is an error naming the field.
func New(pool *pgxpool.Pool, rdb redis.UniversalClient, resolve reconcile.ResolveFunc, cfg *Config) (*Service, error) {
	if pool == nil {
		return nil, errors.New("pgidem: nil pool")
	}
	if resolve == nil {
		return nil, errors.New("pgidem: nil ResolveFunc: a key a 5xx left in progress answers 409 until the reconciler settles or releases it")
	}
	if isNil(rdb) {
		rdb = nil // a typed nil (*redis.Client)(nil) is no client
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	storeCfg := copyOf(c.Store)
	guardCfg := copyOf(c.Guard)
	recCfg := copyOf(c.Reconcile)
	sweepCfg := copyOf(c.Sweep)

	switch {
	case guardCfg.Lock != nil:
		return nil, errors.New("pgidem: Config.Guard.Lock must be nil: New builds the lock from its Redis client (Config.Lock configures it)")
	case guardCfg.Waiter != nil:
		return nil, errors.New("pgidem: Config.Guard.Waiter must be nil: New sets it when Config.Wait is positive")
	case c.Lock != nil && rdb == nil:
		return nil, errors.New("pgidem: Config.Lock is set but New has no Redis client: pass one for the hybrid strategy, or leave Config.Lock nil")
	case recCfg.MeterProvider != nil:
		return nil, errors.New("pgidem: Config.Reconcile.MeterProvider must be nil: Config.Guard.MeterProvider serves every part")
	case sweepCfg.MeterProvider != nil:
		return nil, errors.New("pgidem: Config.Sweep.MeterProvider must be nil: Config.Guard.MeterProvider serves every part")
	case c.Wait < 0:
		return nil, fmt.Errorf("pgidem: Config.Wait %v must not be negative", c.Wait)
	case c.Wait > 0 && !storeCfg.Notify:
		return nil, fmt.Errorf("pgidem: Config.Wait %v needs Config.Store.Notify: without announcements every waiting retry waits its whole bound, then gets 409", c.Wait)
	}
	if guardCfg.Logger == nil {
		guardCfg.Logger = slog.Default()
	}
	log := guardCfg.Logger
	if storeCfg.Logger == nil {
		storeCfg.Logger = log // the Sweeper's and the Listener's
	}
	recCfg.MeterProvider = guardCfg.MeterProvider
	sweepCfg.MeterProvider = guardCfg.MeterProvider

	store, err := durable.New(pool, &storeCfg)
	if err != nil {
		return nil, fmt.Errorf("pgidem: Config.Store: %w", err)
	}
	if rdb != nil {
		locker, err := lock.New(rdb, c.Lock)
		if err != nil {
			return nil, fmt.Errorf("pgidem: Config.Lock: %w", err)
		}
		guardCfg.Lock = locker
	}
	s := &Service{store: store, pool: pool, wait: c.Wait}
	if c.Wait > 0 {
		s.waiter = newWaiter()
		guardCfg.Waiter = s.waiter
	}
	s.guard, err = idem.New(store, &guardCfg)
	if err != nil {
		return nil, fmt.Errorf("pgidem: Config.Guard: %w", err)
	}
	if hold := s.guard.MaxHold(); c.Wait >= hold {
		return nil, fmt.Errorf("pgidem: Config.Wait %v must be shorter than the Guard's MaxHold %v: no request holds its key longer, and a key pending reconciliation is never waited for", c.Wait, hold)
	}
	s.reconciler, err = reconcile.New(s.guard, store, pool, resolve, &recCfg)
	if err != nil {
		return nil, fmt.Errorf("pgidem: Config.Reconcile: %w", err)
	}
	s.sweeper, err = durable.NewSweeper(store, pool, &sweepCfg)
	if err != nil {
		return nil, fmt.Errorf("pgidem: Config.Sweep: %w", err)
	}
	// InProgress and Unavailable keep their defaults (zero: see
	// idem.RetryHints).
	s.hints = idem.RetryHints{Pending: pendingRetry(recCfg, s.guard.MaxHold())}
	// A key settled as soon as it turned pending must still be there when
	// the client told to come back returns.
	if ret, longest := store.Retention(), longestSent(s.hints.Pending); ret <= longest {
		return nil, fmt.Errorf("pgidem: Config.Store.Retention %v must be longer than the longest Retry-After of a pending key, %v (Config.Reconcile's MinAge - the Guard's MaxHold + Interval, plus jitter), or a settled key could expire before its client returns",
			ret, longest)
	}
	return s, nil
}

// longestSent is the longest Retry-After the middleware sends for the hint
// d: d in whole seconds plus its jitter, at most max(1s, d/5) (see
// idem.RetryHints).
func longestSent(d time.Duration) time.Duration {
	secs := int64((d + time.Second - 1) / time.Second)
	return time.Duration(secs+(secs+4)/5) * time.Second
}

// pendingRetry is how long a key that has just turned pending (its claim's
// MaxHold has passed) waits at most for the reconciler's first look at it:
// the reconciler lists a key once it is MinAge old, and runs every Interval.
func pendingRetry(c reconcile.Config, maxHold time.Duration) time.Duration {
	minAge, interval := c.MinAge, c.Interval
	if minAge == 0 {
		minAge = reconcile.DefaultMinAge
	}
	if interval == 0 {
		interval = reconcile.DefaultInterval
	}
	return minAge - maxHold + interval // MinAge > MaxHold: reconcile.New checks it
}

// Guard returns the Guard, for Guard.Do (a queue consumer, gRPC) and
// idem.Complete. HTTP handlers are guarded with [Service.Middleware].
func (s *Service) Guard() *idem.Guard { return s.guard }

// RetryHints returns the Retry-After hints of the Service's refusals: 1s in
// progress, 2s unavailable, and for a key pending reconciliation about the
// longest it waits for the reconciler's first look at it (the runs' own time
// aside), Config.Reconcile's MinAge − the Guard's MaxHold + its Interval
// (43.5s with the defaults, sent as 44s plus jitter). Service.Middleware sends them; pass them to other transports
// (grpcidem.WithRetryHints).
func (s *Service) RetryHints() idem.RetryHints { return s.hints }

// Middleware is Guard().Middleware with cfg, whose zero RetryHints fields
// and zero Wait take the Service's: its RetryHints and Config.Wait. A nil cfg
// is valid. See idem.Guard.Middleware.
func (s *Service) Middleware(scope idem.ScopeFunc, cfg *idem.MiddlewareConfig) func(http.Handler) http.Handler {
	var c idem.MiddlewareConfig
	if cfg != nil {
		c = *cfg
	}
	if c.RetryHints.InProgress == 0 {
		c.RetryHints.InProgress = s.hints.InProgress
	}
	if c.RetryHints.Pending == 0 {
		c.RetryHints.Pending = s.hints.Pending
	}
	if c.RetryHints.Unavailable == 0 {
		c.RetryHints.Unavailable = s.hints.Unavailable
	}
	if c.Wait == 0 {
		c.Wait = s.wait
	}
	return s.guard.Middleware(scope, &c)
}

// Run runs the reconciler, the sweeper and, with Config.Wait, the Listener,
// on every instance (each of the reconciler and the sweeper takes a lease row
// of the table, durable.Leader, so one instance at a time does the work),
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
	l, err := durable.NewListener(ctx, s.store, s.pool)
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

// isNil reports whether c is nil or a typed nil pointer.
func isNil(c redis.UniversalClient) bool {
	if c == nil {
		return true
	}
	v := reflect.ValueOf(c)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
