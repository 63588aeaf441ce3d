package target

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/lock"
)

// Strategies and implementations a Target can be.
const (
	Table   = "table"
	Hybrid  = "hybrid"
	Guard   = "guard"
	Ceiling = "ceiling"
	Minimal = "minimal"
)

// The answer every request's work returns: a 201 with a Location and a small
// JSON body, like the checkout example's.
var (
	answerHeader = http.Header{
		"Content-Type": {"application/json"},
		"Location":     {"/orders/ord_0123456789"},
	}
	answerBody = []byte(`{"id":"ord_0123456789","status":"confirmed","hold_ids":[88211,88212],"amount":4200,"currency":"EUR"}`)
)

// Target serves one request of the bench, through the guard, through the
// ceiling's bare statements, or through the minimal SQL on the minimal table.
type Target interface {
	// Do handles req, whose work sleeps for the configured latency. It
	// returns the idem.Outcome name of what happened ("executed",
	// "replayed", "in_progress", "key_reused") and an error only when the
	// request failed.
	Do(ctx context.Context, req idem.Request) (string, error)
	// Table is the bench table the target writes.
	Table() string
}

// New returns the target of strategy (Table or Hybrid) and impl (Guard,
// Ceiling or Minimal) on env, whose work takes work.
func New(env *Env, strategy, impl string, work time.Duration) (Target, error) {
	switch impl {
	case Guard:
		return newGuard(env, strategy, work)
	case Ceiling:
		return newCeiling(env, strategy, work)
	case Minimal:
		return newMinimal(env, strategy, work)
	}
	return nil, fmt.Errorf("unknown implementation %q (want guard, ceiling or minimal)", impl)
}

func sleepWork(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

type guardTarget struct {
	g      *idem.Guard
	locker *lock.Locker // hybrid only: the guard's
	work   idem.Work
}

func newGuard(env *Env, strategy string, work time.Duration) (Target, error) {
	g, l, err := newGuardLocker(env.PGStatements, env.Redis, env.Schema, env.Prefix, strategy, false)
	if err != nil {
		return nil, err
	}
	return &guardTarget{g: g, locker: l, work: func(ctx context.Context) (idem.Response, error) {
		if err := sleepWork(ctx, work); err != nil {
			return idem.Response{}, err
		}
		return idem.Response{Status: http.StatusCreated, Header: answerHeader, Body: answerBody}, nil
	}}, nil
}

// NewGuard returns the guard of strategy (Table or Hybrid) that every guard
// target of the bench runs, in process or in a worker process: its store on
// the GuardTable of schema through db (with durable.Config.SynchronousAnswers
// set to syncAnswers), its Redis lease (hybrid) under prefix + "guard:"
// through rdb, and no logging.
func NewGuard(db durable.DB, rdb redis.UniversalClient, schema, prefix, strategy string, syncAnswers bool) (*idem.Guard, error) {
	g, _, err := newGuardLocker(db, rdb, schema, prefix, strategy, syncAnswers)
	return g, err
}

// newGuardLocker is NewGuard that also returns the guard's Locker (nil for
// the table strategy).
func newGuardLocker(db durable.DB, rdb redis.UniversalClient, schema, prefix, strategy string, syncAnswers bool) (*idem.Guard, *lock.Locker, error) {
	store, err := durable.New(db, &durable.Config{Schema: schema, Table: GuardTable, SynchronousAnswers: syncAnswers})
	if err != nil {
		return nil, nil, err
	}
	// Store failures are counted as errors by the bench; the guard's log
	// lines would only garble the progress output.
	cfg := &idem.Config{Logger: slog.New(slog.DiscardHandler)}
	var l *lock.Locker
	switch strategy {
	case Table:
	case Hybrid:
		if l, err = lock.New(rdb, &lock.Config{Prefix: prefix + "guard:"}); err != nil {
			return nil, nil, err
		}
		cfg.Lock = l
	default:
		return nil, nil, fmt.Errorf("unknown strategy %q (want table or hybrid)", strategy)
	}
	g, err := idem.New(store, cfg)
	return g, l, err
}

// Handler is the guarded work served over HTTP, for the guard's middleware:
// it sleeps for work (or until the request ends) and answers what the
// in-process guard target's work returns, a 201 with a Location and a small
// JSON body.
func Handler(work time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := sleepWork(r.Context(), work); err != nil {
			http.Error(w, "cancelled", http.StatusServiceUnavailable)
			return
		}
		for k, v := range answerHeader {
			w.Header()[k] = v
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(answerBody)
	})
}

func (t *guardTarget) Table() string { return GuardTable }

func (t *guardTarget) Do(ctx context.Context, req idem.Request) (string, error) {
	_, out, err := t.g.Do(ctx, req, t.work)
	switch {
	case errors.Is(err, idem.ErrInProgress), errors.Is(err, idem.ErrKeyReused):
		return out.String(), nil
	case err != nil:
		return out.String(), err
	case out == idem.OutcomeExecutedUnstored:
		return out.String(), errors.New("answer not stored")
	}
	return out.String(), nil
}

// retention is durable.DefaultRetention in microseconds, as the store passes it.
var retention = durable.DefaultRetention.Microseconds()

// maxHold is the default Guard's MaxHold (46.5 s), in microseconds, the hold
// its claims record.
var maxHold = (46500 * time.Millisecond).Microseconds()

// ceiling issues the guard's statements and commands with nothing around
// them: no validation, no contexts per call, no statistics, no logging, and
// no decoding of the returned row beyond the two columns a decision needs.
// What the guard adds on top of it is its overhead.
type ceiling struct {
	env     *Env
	hybrid  bool
	locker  *lock.Locker // hybrid only
	work    time.Duration
	sql     statements
	headers []byte // as the store writes them (JSON)
	copy    func(idem.Fingerprint) []byte
	tokens  atomic.Uint64
}

func newCeiling(env *Env, strategy string, work time.Duration) (Target, error) {
	if strategy != Table && strategy != Hybrid {
		return nil, fmt.Errorf("unknown strategy %q (want table or hybrid)", strategy)
	}
	sql, err := captureStatements(&durable.Config{Schema: env.Schema, Table: CeilingTable})
	if err != nil {
		return nil, err
	}
	headers, err := json.Marshal(answerHeader)
	if err != nil {
		return nil, err
	}
	var locker *lock.Locker
	if strategy == Hybrid {
		if locker, err = lock.New(env.Redis, &lock.Config{Prefix: env.Prefix + "ceiling:"}); err != nil {
			return nil, err
		}
	}
	return &ceiling{
		env:     env,
		hybrid:  strategy == Hybrid,
		locker:  locker,
		work:    work,
		sql:     sql,
		headers: headers,
		copy:    answerLease(),
	}, nil
}

func (c *ceiling) Table() string { return CeilingTable }

// token returns a fresh 16-byte owner token, cheaply.
func (c *ceiling) token() [16]byte { return nextToken(&c.tokens) }

// nextToken returns a fresh 16-byte owner token from a counter: unique
// within the process, which is all a bench target needs.
func nextToken(n *atomic.Uint64) [16]byte {
	var t [16]byte
	v := n.Add(1)
	for i := range 8 {
		t[i] = byte(v >> (8 * i))
	}
	t[15] = 1
	return t
}

// row is what a decision needs from a returned row, read from the raw
// (undecoded) values by column name.
type row struct {
	found, claimed, expired, inProgress bool
	hash                                []byte
}

// queryRow runs a statement that returns at most one row.
func (c *ceiling) queryRow(ctx context.Context, sql string, args ...any) (row, error) {
	return queryRow(ctx, c.env, sql, args...)
}

// queryRow runs a statement that returns at most one row, through env's
// counting DB, and reads what a decision needs from its raw values: the
// fingerprint, whether an answer is stored, and the claim's two booleans
// (whether it inserted the row, whether the row it found has expired).
func queryRow(ctx context.Context, env *Env, sql string, args ...any) (row, error) {
	var r row
	rows, err := env.PGStatements.Query(ctx, sql, args...)
	if err != nil {
		return r, err
	}
	defer rows.Close()
	if rows.Next() {
		r.found = true
		raw := rows.RawValues()
		for i, fd := range rows.FieldDescriptions() {
			switch fd.Name {
			case "request_hash":
				r.hash = bytes.Clone(raw[i])
			case "response_status":
				r.inProgress = raw[i] == nil
			case "claimed":
				r.claimed = isTrue(raw[i])
			case "expired", "takeable": // takeable: expired, or released
				r.expired = isTrue(raw[i])
			}
		}
	}
	rows.Close()
	return r, rows.Err()
}

// isTrue reads a raw boolean, in binary or text format.
func isTrue(raw []byte) bool {
	return len(raw) == 1 && (raw[0] == 1 || raw[0] == 't')
}

func decide(r row, fp idem.Fingerprint) string {
	switch {
	case !bytes.Equal(r.hash, fp[:]):
		return idem.OutcomeKeyReused.String()
	case r.inProgress:
		return idem.OutcomeInProgress.String()
	}
	return idem.OutcomeReplayed.String()
}

func (c *ceiling) Do(ctx context.Context, req idem.Request) (string, error) {
	if c.hybrid {
		return c.doHybrid(ctx, req)
	}
	return c.doTable(ctx, req, nil)
}

// doTable claims, runs and writes the answer; with a lease (hybrid), it
// then puts the answer's copy in the lease, or, when the claim found a row,
// what the row says.
func (c *ceiling) doTable(ctx context.Context, req idem.Request, lease *lock.Lease) (string, error) {
	owner := c.token()
	// The Guard's arguments: the owner is the first attempt's intent too,
	// and the hold is the default MaxHold.
	r, err := c.queryRow(ctx, c.sql.claim, req.Scope, req.Key, req.Fingerprint[:], owner[:], retention, owner[:], maxHold)
	if err == nil && !r.found {
		// Lost a race with a claimer that committed after our snapshot.
		r, err = c.queryRow(ctx, c.sql.get, req.Scope, req.Key, retention)
		if err == nil && !r.found {
			return idem.OutcomeInProgress.String(), nil
		}
	}
	switch {
	case err != nil:
		return "", err
	case r.expired:
		// Keys are unique within a run and live 24 hours: not reached.
		return "", errors.New("ceiling: the claim found an expired row, which the ceiling does not take over")
	case !r.claimed:
		out := decide(r, req.Fingerprint)
		if lease != nil {
			state := leaseState(leaseRunning, idem.Fingerprint(r.hash))
			if !r.inProgress {
				state = leaseState(leaseDone, idem.Fingerprint(r.hash)) // the guard copies the row's answer
			}
			if err := lease.Replace(context.WithoutCancel(ctx), state, 0); err != nil && !errors.Is(err, lock.ErrNotHeld) {
				return "", err
			}
		}
		return out, nil
	}
	if err := sleepWork(ctx, c.work); err != nil {
		return "", err
	}
	_, err = c.env.PGStatements.Exec(context.WithoutCancel(ctx), c.sql.complete, req.Scope, req.Key, owner[:],
		int16(http.StatusCreated), c.headers, answerBody, retention)
	if err != nil {
		return "", err
	}
	if lease != nil {
		// As the guard: the copy goes with the next exchange, unwaited; a
		// lost copy only sends replays to the row.
		c.locker.Set(req.Scope, req.Key, c.copy(req.Fingerprint), leaseCopyTTL, nil)
	}
	return idem.OutcomeExecuted.String(), nil
}

// doHybrid is the guard's hybrid protocol since the lease carries the key's
// state: one round trip (the lock's obtain: SET NX GET and PTTL) takes the
// lease with the state "claiming" and this request's fingerprint, or returns
// the state held, which answers 409, 422 or a replay without PostgreSQL; the
// holder claims the durable row like the table strategy and, once its answer
// is written, puts a copy of it in the lease (lock.Locker.Set). A state that
// cannot tell (claiming under another fingerprint, the done marker) reads the
// row.
func (c *ceiling) doHybrid(ctx context.Context, req idem.Request) (string, error) {
	lease, held, err := c.locker.Obtain(ctx, req.Scope, req.Key, leaseState(leaseClaiming, req.Fingerprint))
	switch {
	case errors.Is(err, lock.ErrNotObtained):
		if out, ok := decideLease(held, req.Fingerprint); ok {
			return out, nil
		}
		r, err := c.queryRow(ctx, c.sql.get, req.Scope, req.Key, retention)
		switch {
		case err != nil:
			return "", err
		case r.found:
			return decide(r, req.Fingerprint), nil
		}
		return c.doTable(ctx, req, nil)
	case err != nil:
		return "", err
	}
	return c.doTable(ctx, req, lease)
}

// The lease states of idem's hybrid (lease.go), as far as a decision needs
// them: the kind byte, then the fingerprint, then for an answer its copy.
const (
	leaseClaiming byte = 'c'
	leaseRunning  byte = 'r'
	leasePending  byte = 'p'
	leaseAnswer   byte = 'A'
	leaseDone     byte = 'd'
	leaseCopyTTL       = 10 * time.Minute
)

func leaseState(kind byte, fp idem.Fingerprint) []byte {
	return append([]byte{kind}, fp[:]...)
}

// answerLease returns the function that builds the copy of the bench's
// answer under a fingerprint, encoded as idem encodes it: status (2 bytes),
// the length of the encoded headers (uvarint), the headers (the number of
// names; per name its length and bytes, its number of values plus one, each
// value's length and bytes; all numbers uvarints), the body. All but the
// fingerprint is built once.
func answerLease() func(idem.Fingerprint) []byte {
	str := func(b []byte, s string) []byte { return append(binary.AppendUvarint(b, uint64(len(s))), s...) }
	h := binary.AppendUvarint(nil, uint64(len(answerHeader)))
	for name, values := range answerHeader {
		h = str(h, name)
		h = binary.AppendUvarint(h, uint64(len(values))+1)
		for _, v := range values {
			h = str(h, v)
		}
	}
	tail := binary.BigEndian.AppendUint16(nil, http.StatusCreated)
	tail = binary.AppendUvarint(tail, uint64(len(h)))
	tail = append(append(tail, h...), answerBody...)
	return func(fp idem.Fingerprint) []byte {
		return append(leaseState(leaseAnswer, fp), tail...)
	}
}

// decideLease answers from a held state, or reports false when the row must
// be read.
func decideLease(held []byte, fp idem.Fingerprint) (string, bool) {
	if len(held) < 1+len(fp) {
		return "", false
	}
	kind, same := held[0], bytes.Equal(held[1:1+len(fp)], fp[:])
	switch {
	case kind == leaseClaiming && !same, kind == leaseDone && same:
		return "", false
	case !same:
		return idem.OutcomeKeyReused.String(), true
	case kind == leaseAnswer:
		return idem.OutcomeReplayed.String(), true
	case kind == leaseClaiming, kind == leaseRunning, kind == leasePending:
		return idem.OutcomeInProgress.String(), true
	}
	return "", false
}
