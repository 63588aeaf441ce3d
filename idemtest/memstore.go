package idemtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/idemguard/idem"
)

// MemStoreConfig configures a [MemStore]. The zero value, like a nil
// *MemStoreConfig, gives the defaults.
type MemStoreConfig struct {
	// Now is the store's clock: it stamps CreatedAt and CompletedAt and
	// decides which keys have expired, as the database clock does for the
	// PostgreSQL store. It is called with the store's lock held, so it must
	// not call the store.
	//
	// The Guard reads only durations from the store (Record.Age, Record.TTL,
	// the hold), so a clock far from the wall clock changes nothing but
	// the times it stamps. To expire one key, use [MemStore.Age].
	//
	// Defaults to time.Now.
	Now func() time.Time
}

// MemStore is an in-memory [idem.Store] for unit tests: a Guard over it runs
// work at most once per key without PostgreSQL. It keeps the promises of the
// PostgreSQL store (*durable.Store) that [RunStoreSuite] checks, and passes
// it. Its keys live 24h after their answer or release, as with
// durable.DefaultRetention; [MemStore.Age] expires one at once. It joins any
// transaction value (see [MemStore.Join]), so a handler that calls
// idem.Complete runs over it too; what a real transaction does to the answer
// (a rollback) is tested with the PostgreSQL store of package
// idemtest/pgtest. The promises it keeps:
//
//   - among any number of concurrent Claims of one key exactly one wins; the
//     others get the live row; an expired row is taken over by the next Claim
//     as a new intent, a released one by the next Claim of the same request
//     as the next attempt of its intent; a row in progress never expires;
//   - Get, Complete and Release see only live rows, and fail with errors
//     matching idem.ErrNotFound, idem.ErrNotOwner, idem.ErrCompleted
//     and idem.ErrInvalid (compare with errors.Is) where the PostgreSQL
//     store does;
//   - only the owner completes (idempotently, with the same answer) or
//     releases its in-progress row; a finished row is never changed;
//   - answers are stored as the PostgreSQL store stores them: a copy, with
//     headers encoded as JSON (so a header value with a NUL byte is refused
//     and invalid UTF-8 comes back as U+FFFD) and a nil Header or Body read
//     back empty; times have microsecond precision.
//
// Records it returns are the caller's own: changing them changes nothing in
// the store. A MemStore is safe for concurrent use. Its zero value is not
// usable: call [NewMemStore].
//
// WARNING: it is for tests only. Nothing is durable, rows live in one
// process (two instances of a service never see each other's keys), and
// memory grows with every key until it expires and [MemStore.Sweep] runs.
type MemStore struct {
	retention time.Duration
	now       func() time.Time

	mu   sync.Mutex
	rows map[memKey]*memRow
}

// retention is durable.DefaultRetention, which this package does not import
// so that a test over a MemStore links no PostgreSQL driver
// (TestMemStoreDefaults checks that the two agree).
const retention = 24 * time.Hour

type memKey struct{ scope, key string }

// memRow is a row as the table holds it: the answer encoded, nil while in
// progress.
type memRow struct {
	fp          idem.Fingerprint
	owner       idem.Token
	intent      idem.Token
	attempt     int
	answer      *memAnswer
	createdAt   time.Time
	holdUntil   time.Time
	completedAt time.Time
	releasedAt  time.Time // zero unless released
}

type memAnswer struct {
	status  int
	headers []byte // JSON, as in the jsonb column
	body    []byte
}

var (
	_ idem.Store  = (*MemStore)(nil)
	_ idem.Joiner = (*MemStore)(nil)
)

// NewMemStore returns an empty MemStore. A nil cfg gives the defaults.
func NewMemStore(cfg *MemStoreConfig) *MemStore {
	var c MemStoreConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return &MemStore{retention: retention, now: c.Now, rows: make(map[memKey]*memRow)}
}

// Retention returns how long a key lives after its answer or release: 24h.
func (s *MemStore) Retention() time.Duration { return s.retention }

// Join returns the MemStore itself, whatever tx is (a unit test's stand-in
// for the handler's transaction, or nil): an answer idem.Complete writes
// through it is stored at once, as if tx had committed. It never fails.
func (s *MemStore) Join(tx any) (idem.Store, error) { return s, nil }

// Claim tries to make p.Owner the owner of the key, as [durable.Store.Claim]:
// it creates an in-progress row, or takes over an expired one (a new intent:
// new fingerprint, owner and intent, attempt 1) or a released one of the
// same fingerprint (the next attempt of its intent), with no answer and
// CreatedAt now, and returns it with claimed == true; otherwise it returns
// the row that is there with claimed == false.
func (s *MemStore) Claim(_ context.Context, p idem.ClaimParams) (idem.Record, bool, error) {
	const op = "claim"
	if err := checkKey(op, p.Scope, p.Key); err != nil {
		return idem.Record{}, false, err
	}
	if p.Owner == (idem.Token{}) {
		return idem.Record{}, false, invalid(op, "owner token is zero")
	}
	if p.Hold < 0 {
		return idem.Record{}, false, invalid(op, fmt.Sprintf("hold %v is negative", p.Hold))
	}
	if p.Intent == (idem.Token{}) {
		p.Intent = p.Owner
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	k := memKey{p.Scope, p.Key}
	r, ok := s.rows[k]
	switch {
	case !ok || s.expired(r, now):
		r = &memRow{fp: p.Fingerprint, intent: p.Intent, attempt: 1}
		s.rows[k] = r
	case !r.releasedAt.IsZero() && r.fp == p.Fingerprint:
		r.attempt++ // the next attempt of the same intent
	default:
		rec, err := s.record(r, k, now)
		return rec, false, err
	}
	r.owner, r.answer, r.createdAt, r.holdUntil = p.Owner, nil, now, now.Add(p.Hold)
	r.completedAt, r.releasedAt = time.Time{}, time.Time{}
	rec, err := s.record(r, k, now)
	return rec, true, err
}

// Get returns the live row of a key, or an error matching
// idem.ErrNotFound when there is none or it has expired.
func (s *MemStore) Get(_ context.Context, scope, key string) (idem.Record, error) {
	const op = "get"
	if err := checkKey(op, scope, key); err != nil {
		return idem.Record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := memKey{scope, key}
	r, ok := s.rows[k]
	now := s.clock()
	if !ok || !s.live(r, now) {
		return idem.Record{}, notFound(op)
	}
	return s.record(r, k, now)
}

// Complete stores a as the answer of the in-progress row that owner claimed,
// as [durable.Store.Complete]. It returns nil when the owner's row already
// holds an equal answer ([idem.Response.Equal]), so a retry is safe;
// otherwise an error matching idem.ErrNotFound, idem.ErrNotOwner or
// idem.ErrCompleted, and nothing is written. A status outside 100..599 or
// a NUL byte in a header is refused with an error matching
// idem.ErrInvalid.
func (s *MemStore) Complete(_ context.Context, scope, key string, owner idem.Token, a idem.Response) error {
	const op = "complete"
	if err := checkKey(op, scope, key); err != nil {
		return err
	}
	enc, err := encodeAnswer(op, a)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	k := memKey{scope, key}
	r, err := s.inProgress(op, k, owner, now)
	if err != nil {
		if r != nil && r.owner == owner && r.answer != nil {
			if got, derr := r.answer.decode(); derr == nil && got.Equal(a) {
				return nil
			}
		}
		return err
	}
	r.answer, r.completedAt = enc, now
	return nil
}

// Release marks the in-progress row that owner claimed released, as
// [durable.Store.Release]: the row keeps its fingerprint and intent, Get no
// longer finds it, and the next Claim of the same request takes it over. It
// fails as Complete does, and never releases a finished row.
func (s *MemStore) Release(_ context.Context, scope, key string, owner idem.Token) error {
	const op = "release"
	if err := checkKey(op, scope, key); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := memKey{scope, key}
	now := s.clock()
	r, err := s.inProgress(op, k, owner, now)
	if err != nil {
		return err
	}
	r.releasedAt = now
	return nil
}

// Age makes the row of (scope, key) older by `by`, as if it had been claimed
// that much earlier, whether it is live or expired, in progress, finished or
// released: its claim, answer, release and hold all move back by `by`. An
// answered or released row is live while its answer or release is at most
// Retention old: Age(scope, key, s.Retention()+time.Second) expires it; a
// row in progress never expires, and aging it past the Guard's MaxHold
// makes it look abandoned (idem.ErrPending). A negative `by` makes the row
// younger. Age reports whether there was a row.
func (s *MemStore) Age(scope, key string, by time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.rows[memKey{scope, key}]
	if ok {
		for _, t := range []*time.Time{&r.createdAt, &r.holdUntil, &r.completedAt, &r.releasedAt} {
			if !t.IsZero() {
				*t = t.Add(-by)
			}
		}
	}
	return ok
}

// Sweep deletes every expired row and returns how many it deleted, as
// [durable.Sweeper.SweepOnce]. Expired rows are invisible to every other call
// whether or not they have been swept. When ctx has ended it deletes nothing
// and returns an error wrapping ctx's error.
func (s *MemStore) Sweep(ctx context.Context) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("idemtest: sweep: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	var n int64
	for k, r := range s.rows {
		if s.expired(r, now) {
			delete(s.rows, k)
			n++
		}
	}
	return n, nil
}

// clock reads s.now with the database's precision. s.mu must be held.
func (s *MemStore) clock() time.Time { return s.now().Truncate(time.Microsecond) }

// live reports whether r is held by a claim or answered, and has not
// expired at now.
func (s *MemStore) live(r *memRow, now time.Time) bool {
	return r.releasedAt.IsZero() && !s.expired(r, now)
}

// expired reports whether r was answered or released longer than the
// retention before now; a row in progress never expires.
func (s *MemStore) expired(r *memRow, now time.Time) bool {
	end := r.completedAt
	if end.IsZero() {
		end = r.releasedAt
	}
	return !end.IsZero() && end.Before(now.Add(-s.retention))
}

// inProgress returns the live in-progress row of k that owner claimed, or,
// with the error durable's Store gives, the live row that is there instead
// (nil when there is none). s.mu must be held.
func (s *MemStore) inProgress(op string, k memKey, owner idem.Token, now time.Time) (*memRow, error) {
	r, ok := s.rows[k]
	switch {
	case !ok || !s.live(r, now):
		return nil, notFound(op)
	case r.owner != owner:
		return r, &storeError{op: op, kind: idem.ErrNotOwner}
	case r.answer != nil:
		return r, &storeError{op: op, kind: idem.ErrCompleted}
	}
	return r, nil
}

// record returns a copy of r, read at now, that shares nothing with the
// store.
func (s *MemStore) record(r *memRow, k memKey, now time.Time) (idem.Record, error) {
	rec := idem.Record{
		Scope:       k.scope,
		Key:         k.key,
		Fingerprint: r.fp,
		Owner:       r.owner,
		Intent:      r.intent,
		Attempt:     r.attempt,
		CreatedAt:   r.createdAt,
		HoldUntil:   r.holdUntil,
		CompletedAt: r.completedAt,
		ReleasedAt:  r.releasedAt,
		Age:         now.Sub(r.createdAt),
		TTL:         s.retention, // in progress: never expires
	}
	if !r.completedAt.IsZero() {
		rec.TTL = r.completedAt.Add(s.retention).Sub(now)
	} else if !r.releasedAt.IsZero() {
		rec.TTL = r.releasedAt.Add(s.retention).Sub(now)
	}
	if r.answer != nil {
		a, err := r.answer.decode()
		if err != nil {
			return idem.Record{}, err
		}
		rec.Answer = &a
	}
	return rec, nil
}

// encodeAnswer copies a as the PostgreSQL store writes it: the headers as
// JSON (jsonb refuses a NUL byte), a nil Body as empty.
func encodeAnswer(op string, a idem.Response) (*memAnswer, error) {
	if a.Status < 100 || a.Status > 599 {
		return nil, invalid(op, fmt.Sprintf("status %d is outside 100..599", a.Status))
	}
	h := a.Header
	if h == nil {
		h = http.Header{}
	}
	for name, values := range h {
		if strings.IndexByte(name, 0) >= 0 || !utf8.ValidString(name) {
			return nil, invalid(op, "a header name contains a NUL byte or is not valid UTF-8")
		}
		for _, v := range values {
			if strings.IndexByte(v, 0) >= 0 || !utf8.ValidString(v) {
				return nil, invalid(op, "a value of header "+name+" contains a NUL byte or is not valid UTF-8: it cannot be stored byte for byte")
			}
		}
	}
	headers, err := json.Marshal(h)
	if err != nil {
		return nil, &storeError{op: op, kind: idem.ErrInvalid, cause: err}
	}
	body := bytes.Clone(a.Body)
	if body == nil {
		body = []byte{}
	}
	return &memAnswer{status: a.Status, headers: headers, body: body}, nil
}

// decode returns a fresh copy of the answer, as durable's scanRecord reads it:
// a non-nil Header and Body.
func (m *memAnswer) decode() (idem.Response, error) {
	a := idem.Response{Status: m.status, Header: http.Header{}, Body: bytes.Clone(m.body)}
	if err := json.Unmarshal(m.headers, &a.Header); err != nil {
		return idem.Response{}, fmt.Errorf("idemtest: response headers: %w", err)
	}
	if a.Header == nil {
		a.Header = http.Header{}
	}
	return a, nil
}

func checkKey(op, scope, key string) error {
	for _, f := range []struct{ name, s string }{{"scope", scope}, {"key", key}} {
		if strings.IndexByte(f.s, 0) >= 0 {
			return invalid(op, f.name+" contains a NUL byte")
		}
		if !utf8.ValidString(f.s) {
			return invalid(op, f.name+" is not valid UTF-8")
		}
	}
	return nil
}

func invalid(op, detail string) error {
	return &storeError{op: op, kind: idem.ErrInvalid, cause: errors.New(detail)}
}

func notFound(op string) error {
	return &storeError{op: op, kind: idem.ErrNotFound}
}

// storeError is an error of one MemStore call, as durable's: its kind (one
// of idem's store errors) and cause, both reachable with errors.Is and
// errors.As, in one line that names each layer once ("idemtest: complete:
// not found").
type storeError struct {
	op    string
	kind  error
	cause error
}

func (e *storeError) Error() string {
	s := "idemtest: " + e.op + ": " + strings.TrimPrefix(e.kind.Error(), "idem: ")
	if e.cause != nil {
		s += ": " + e.cause.Error()
	}
	return s
}

func (e *storeError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.kind}
	}
	return []error{e.kind, e.cause}
}
