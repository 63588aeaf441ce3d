package durable

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Errors of the leases of the jobs that run one instance at a time
// ([Store.Lead], and so [Sweeper] and the reconciler). Compare with
// errors.Is.
var (
	// ErrLocked is returned by [Store.Lead], [Sweeper.SweepOnce] and
	// reconcile.Reconciler.RunOnce when another instance holds the table's
	// lease of the job: it is running right now, so this round is skipped.
	// It is a normal outcome when the job runs on every instance.
	ErrLocked = errors.New("durable: another instance holds the lease")
	// ErrLeaseLost is the error of [Store.Lead] when its lease could not be
	// renewed in time: fn's context was cancelled before the lease could
	// have expired, so that fn had stopped acting as the leader before
	// another holder could take over. It is also the error of a Store's
	// write made under a lease that had passed (see [Store.Lead]): the
	// write changed nothing.
	ErrLeaseLost = errors.New("durable: lease lost")
)

// leaseMargin is the share of a lease's remaining time that its holder
// leaves unused (one eighth): room for a difference between the rates of
// the host's and the database's clocks, and for scheduling delays.
const leaseMargin = 8

// leader makes one holder at a time, across a fleet, run a job on a table:
// the reconciler's runs and the sweeper's. Leadership is a lease: a row of
// the table's lease table (<table>_leases) naming the job, its holder, and
// when the lease expires on the database's clock.
//
// Each take, renewal and release is one autocommit statement, so nothing
// is tied to a server session: it works through any connection pooler,
// PgBouncer in transaction mode included, and a holder that dies only delays
// the next one until its lease expires. A lease that has expired is never
// renewed: the next holder takes it anew.
//
// A holder cannot tell that it was paused (a SIGSTOP, a VM pause) past its
// lease, so the writes it makes to the table through a [Store] are fenced by
// the lease in their statement (see [Store.Lead]).
//
// A leader is safe for concurrent use. Each do call is a holder of its own,
// so two calls exclude each other as two instances do.
type leader struct {
	db     DB
	job    string
	leases string // the lease table, quoted and qualified
	tail   time.Duration
	ttl    time.Duration
	sql    leaseStatements
}

// newLeader returns a leader of job (a short name, such as "reconcile") on
// table, the quoted, qualified name of an idempotency table as
// [Store.Table] returns it, whose statements run on db. db must be a pool or
// a connection, not a transaction: each statement must commit on its own.
//
// tail is the longest the job may go on acting after its context is
// cancelled, such as the timeout of a write it lets finish. The lease lasts
// four tails, and is renewed every tail.
func newLeader(db DB, table, job string, tail time.Duration) (*leader, error) {
	switch {
	case db == nil:
		return nil, errNilDB
	case job == "":
		return nil, errors.New("empty job")
	case tail <= 0:
		return nil, fmt.Errorf("the lease's tail must be positive, got %v", tail)
	}
	leases := besideTable(table, "_leases")
	return &leader{
		db:     db,
		job:    job,
		leases: leases,
		tail:   tail,
		ttl:    4 * tail,
		sql:    newLeaseStatements(leases),
	}, nil
}

// Lead runs fn as the one holder, across a fleet, of job (a short name, such
// as "reconcile") on the Store's table, when it can take the job's lease: it
// returns an error wrapping [ErrLocked], without calling fn, when another
// holder's lease is live. Otherwise it returns fn's error, after giving the
// lease back. The lease is a row of the lease table beside the table
// (<table>_leases); each take, renewal and release is one autocommit
// statement on the Store's database, so it works through any connection
// pooler, PgBouncer in transaction mode included, and a holder that dies only
// delays the next one until its lease expires. The Store must not be bound
// to a caller's transaction ([Store.WithDB]).
//
// tail is the longest fn may go on acting after its context is cancelled,
// such as the timeout of a write it lets finish. The lease lasts four tails,
// each time counted from the database's now(), and is renewed every tail.
// This host counts what is left of the lease on its monotonic clock, from
// the moment it sent the statement and less a margin of an eighth; the two
// clocks are never compared. When a renewal fails, or has not come back one
// tail before what is left runs out, fn's context is cancelled and Lead
// returns an error wrapping [ErrLeaseLost]: fn must then stop within tail,
// which leaves it done before the lease can have expired and another holder
// can take it. A lease that has expired is never renewed: the next holder
// takes it anew.
//
// fn's context carries the lease, and so does every context derived from it
// (context.WithoutCancel included). The Store's writes made with such a
// context are fenced by it: [Store.Complete], [Store.Release],
// [Store.Postpone] and [Store.MarkScanned] each check, in their statement and
// on the database's clock alone, that the lease is still this call's and has
// not expired. A write that finds it passed or taken (its holder was paused
// longer than the lease, a SIGSTOP, a VM pause, or its statement arrived
// late) changes nothing and returns an error wrapping [ErrLeaseLost]; one that
// finds it live commits before any next holder can take it. So nothing fn
// writes through the Store lands after the lease has passed, however long
// this process is stopped.
func (s *Store) Lead(ctx context.Context, job string, tail time.Duration, fn func(ctx context.Context) error) error {
	if s.joined {
		return errors.New("durable: lead: the store is bound to a caller's transaction (Store.WithDB): a lease commits each statement on its own")
	}
	l, err := newLeader(s.db, s.table, job, tail)
	if err != nil {
		return fmt.Errorf("durable: lead: %w", err)
	}
	return l.do(ctx, fn)
}

// do is [Store.Lead] on l's table and job.
func (l *leader) do(ctx context.Context, fn func(ctx context.Context) error) error {
	holder := newHolder()
	until, err := l.hold(ctx, l.sql.take, holder)
	if err != nil {
		return l.error(err)
	}
	defer l.release(ctx, holder)
	if time.Until(until) <= l.tail {
		return l.lost(errors.New("taking it took too long"))
	}

	lctx, lose := context.WithCancelCause(withFence(ctx, fence{leases: l.leases, job: l.job, holder: holder}))
	defer lose(nil)
	stop := make(chan struct{})
	kept := make(chan struct{})
	go func() {
		defer close(kept)
		l.keep(ctx, holder, until, stop, lose)
	}()
	func() {
		defer func() { // also when fn panics
			close(stop)
			<-kept
		}()
		err = fn(lctx)
	}()
	if cause := context.Cause(lctx); errors.Is(cause, ErrLeaseLost) {
		return cause
	}
	return err
}

// keep renews the lease of holder every tail until stop is closed. When a
// renewal fails, or none has come back one tail before until, it calls lose
// and returns.
func (l *leader) keep(ctx context.Context, holder string, until time.Time, stop <-chan struct{}, lose context.CancelCauseFunc) {
	expire := time.NewTimer(time.Until(until) - l.tail)
	defer expire.Stop()
	tick := time.NewTicker(l.tail)
	defer tick.Stop()
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	type renewal struct {
		until time.Time
		err   error
	}
	var inFlight chan renewal // nil when no renewal is in flight
	for {
		select {
		case <-stop:
			return
		case <-expire.C:
			lose(l.lost(errors.New("not renewed in time")))
			return
		case <-tick.C:
			if inFlight != nil {
				continue
			}
			ch := make(chan renewal, 1)
			inFlight = ch
			wg.Go(func() {
				u, err := l.hold(rctx, l.sql.renew, holder)
				ch <- renewal{u, err}
			})
		case r := <-inFlight:
			inFlight = nil
			if r.err != nil {
				lose(l.lost(r.err))
				return
			}
			expire.Reset(time.Until(r.until) - l.tail)
		}
	}
}

// hold takes (l.sql.take) or renews (l.sql.renew) the lease for holder, in
// one statement, and returns until when, on this host's monotonic clock,
// holder may act on it. It returns ErrLocked when another holder's lease is
// live, or, for a renewal, when holder's lease has expired.
func (l *leader) hold(ctx context.Context, stmt, holder string) (time.Time, error) {
	sent := time.Now()
	var now, expires time.Time
	err := l.db.QueryRow(ctx, stmt, l.job, holder, l.ttl.Microseconds()).Scan(&now, &expires)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, ErrLocked
	}
	if err != nil {
		return time.Time{}, err
	}
	left := expires.Sub(now) // both read on the database's clock
	return sent.Add(left - left/leaseMargin), nil
}

// error wraps an error of hold for Do's caller.
func (l *leader) error(err error) error {
	if errors.Is(err, ErrLocked) {
		return &opError{op: "lead " + l.job, kind: ErrLocked}
	}
	return &opError{op: "lead " + l.job, err: err}
}

// lost is the error of a lease lost for cause.
func (l *leader) lost(cause error) error {
	if errors.Is(cause, ErrLocked) {
		cause = errors.New("it has expired, or another holder has taken it")
	}
	return &opError{op: "lead " + l.job, kind: ErrLeaseLost, err: cause}
}

// release gives the lease of holder back, best effort, so that the next
// holder need not wait for it to expire. It runs even when ctx has ended,
// bounded by tail.
func (l *leader) release(ctx context.Context, holder string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.tail)
	defer cancel()
	_, _ = l.db.Exec(rctx, l.sql.release, l.job, holder)
}

// newHolder names a holder: the host, the process and a random part, so
// that an operator reading the lease table sees who leads.
func newHolder() string {
	host, _ := os.Hostname()
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// besideTable names the table beside the quoted, qualified table t whose
// name is t's plus suffix, as the migrations name it.
func besideTable(t, suffix string) string {
	if strings.HasSuffix(t, `"`) {
		return t[:len(t)-1] + suffix + `"`
	}
	return t + suffix
}
