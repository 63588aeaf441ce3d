package durable

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/internal/rare"
)

// claimAttempts bounds Claim's loop of a claim statement followed by a
// takeover or a Get.
const claimAttempts = 3

// errContended is the cause Claim reports when, claimAttempts times in a row,
// the row changed between the claim statement and the takeover or Get that
// followed it.
var errContended = errors.New("row kept changing under concurrent claims and releases")

// Store reads and writes the idempotency table. Every method is one
// statement, so one round trip, except where its comment says otherwise
// (Claim under a race, and the failure paths of Complete and Release).
//
// A Store serves only a table at the schema version its statements are
// written for. The first Claim or Get, and the first statement of each
// Sweeper and reconciler run, read the version the migrations recorded (the
// view <table>_schema), once more at most every minute on the request path:
// a table migrated ahead of this build, or not migrated yet, is refused
// with an error that says so (the Guard answers 503), so that an instance of
// an older build never acts under rules a newer migration changed. That is
// one more round trip for a Store's first request and one a minute after.
//
// A Store is safe for concurrent use. Its methods never change its state;
// [Store.WithDB] returns a copy bound to another DB, such as a transaction.
type Store struct {
	db        DB
	admit     DB // db, or, over a *pgxpool.Pool, db with Config.AdmissionWait (Claim, Get)
	cfg       Config
	table     string // quoted and qualified
	retention int64  // cfg.Retention in microseconds
	sql       *statements
	backlog   *backlogStatements // the reconciler's (backlog.go)
	channel   string             // the table's notification channel (Config.Notify, Listener)
	joined    bool               // db is the caller's (WithDB): its transaction is never changed
	schema    *schemaCheck       // shared with the copies WithDB makes
	// claims and answers share statements among concurrent requests
	// (batch.go); nil unless db is a pool (statter), and when db is a
	// caller's transaction (WithDB), whose statements are the caller's to
	// order.
	claims  *batcher[claimReq, claimRes]
	answers *batcher[answerReq, bool]
	// newKeys counts the claims that found their key's row (shared with
	// the copies WithDB makes): while they are rare, claims insert first
	// (claimOne, claimMany).
	newKeys *rare.Window
}

// A Store is the Guard's store, and can join a caller's transaction.
var (
	_ idem.Store  = (*Store)(nil)
	_ idem.Joiner = (*Store)(nil)
)

// New returns a Store that runs its statements through db. A nil cfg gives
// the defaults. It returns an error naming the field when cfg is invalid.
// New does not touch the database: run [Migrate] first.
func New(db DB, cfg *Config) (*Store, error) {
	if db == nil {
		return nil, errNilDB
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	qualified := c.qualified()
	admit := db
	if pool, ok := db.(*pgxpool.Pool); ok {
		admit = admitting{pool: pool, wait: c.AdmissionWait}
	}
	s := &Store{
		db:        db,
		admit:     admit,
		cfg:       c,
		table:     qualified,
		retention: c.Retention.Microseconds(),
		sql:       newStatements(qualified),
		backlog:   newBacklog(qualified, c.qualifiedAs(table+"_reconcile")),
		channel:   channelOf(qualified),
		schema:    newSchemaCheck(c.qualifiedAs(table + "_schema")),
		newKeys:   rare.New(rare.Size, rare.Enter, rare.Leave),
	}
	if p, ok := db.(statter); ok {
		// Counted by the Store, not read from the pool on every request
		// (the pool's Stat takes its lock); the pool's size is read once,
		// on the first statement, when the pool is in use.
		busy := new(atomic.Int64)
		conns := sync.OnceValue(func() int64 {
			if st := p.Stat(); st != nil {
				return int64(st.MaxConns())
			}
			return math.MaxInt64 // a wrapper of no pool: never shared
		})
		exhausted := func() bool { return busy.Load() >= conns() }
		s.claims = &batcher[claimReq, claimRes]{exhausted: exhausted, busy: busy, maxBatch: batchMax,
			key: func(r *claimReq) string { return rowKey(r.p.Scope, r.p.Key) },
			one: s.claimOne, many: s.claimMany}
		s.answers = &batcher[answerReq, bool]{exhausted: exhausted, busy: busy, maxBatch: batchMax,
			key: func(r *answerReq) string { return rowKey(r.scope, r.key) },
			one: s.completeOne, many: s.completeMany}
	}
	return s, nil
}

// statter is a DB that tells how busy its pool is: a *pgxpool.Pool, or a
// wrapper of one that passes its Stat on. A Store shares statements only
// over such a DB (batch.go).
type statter interface {
	Stat() *pgxpool.Stat
}

// WithDB returns a Store with the same configuration whose statements run
// through db, for example a pgx.Tx: a Complete through it is then committed
// or rolled back with the caller's own writes. s is not changed. db must not
// be nil.
//
// A Complete through a Store returned by WithDB commits when db's transaction
// does, with db's own synchronous_commit: it never changes the settings of
// the caller's transaction.
func (s *Store) WithDB(db DB) *Store {
	c := *s
	c.db, c.admit = db, db
	c.joined = true
	c.claims, c.answers = nil, nil
	return &c
}

// Join is WithDB for idem.Complete, which names no driver type: tx must be a
// DB, such as a pgx.Tx; anything else is refused with an error wrapping
// idem.ErrJoinUnsupported.
func (s *Store) Join(tx any) (idem.Store, error) {
	db, ok := tx.(DB)
	if !ok {
		return nil, fmt.Errorf("durable: join: %T is not a durable.DB (a pgx.Tx, *pgx.Conn or *pgxpool.Pool): %w", tx, idem.ErrJoinUnsupported)
	}
	return s.WithDB(db), nil
}

// Retention returns how long a key lives after its answer or its release; a
// key in progress never expires.
func (s *Store) Retention() time.Duration { return s.cfg.Retention }

// Table returns the quoted, schema-qualified name of the table as used in the
// Store's SQL, for example "idem"."idempotency_keys", or "idempotency_keys"
// when no schema is configured.
func (s *Store) Table() string { return s.table }

// checkClaim reports the first field of p that the table cannot take.
func checkClaim(op string, p *idem.ClaimParams) error {
	if err := checkText(op, "scope", p.Scope); err != nil {
		return err
	}
	if err := checkText(op, "key", p.Key); err != nil {
		return err
	}
	if p.Owner == (idem.Token{}) {
		return invalid(op, "owner token is zero")
	}
	if p.Hold < 0 {
		return invalid(op, fmt.Sprintf("hold %v is negative", p.Hold))
	}
	return nil
}

// Claim tries to make p.Owner the owner of the key. It inserts an in-progress
// row for p or takes over the existing row when that row is takeable:
//
//   - expired (answered or released longer than the retention ago): the
//     claim is a new intent (p.Intent, attempt 1, p's fingerprint), even
//     before a Sweeper has deleted the row;
//   - released, and p has the row's fingerprint: the claim is the next
//     attempt of the same intent (the row's Intent, Attempt + 1).
//
// A row in progress is never taken over, however old: only its owner (or a
// reconciler, through Complete and Release) ends it.
//
// When it wins it returns the new row and claimed == true. Otherwise it
// returns the row that is there, in progress, answered, or released by
// another request, and claimed == false; the caller compares its
// Fingerprint with p.Fingerprint. Among any number of concurrent Claims of
// one key exactly one wins. Claim never waits for a row lock held by another
// transaction (one that completed the key's answer and has not committed):
// it returns the row as it was, in progress.
//
// Over a *pgxpool.Pool (or a DB that passes on its Stat), concurrent Claims
// share statements once the Store's statements queue: when they take every
// connection of the pool, or when the claim statements in flight have
// reached their limit, which falls while their latency shows them waiting at
// the server and rises while it does not, a Claim waits for a claim
// statement in flight instead of adding to the queue, and the Claims waiting
// then go together as one statement and one commit on the connection it
// gives back, each with its own key's result (group commit). A Claim whose
// context ends while it waits is never sent. A Store bound to a caller's
// transaction ([Store.WithDB]) never shares.
//
// Claim is one statement, so one round trip, with three exceptions. While
// the Store's recent claims have rarely found their key's row (at most 2% of
// a window of 512, until 5% of one do), Claim first runs a plain insert
// (shared like the claim statement), which costs PostgreSQL less for a new
// key, and the claim statement only when the key has a row. When the key's row is takeable, a second
// statement takes it over. When Claim races with another claimer, a row
// committed by another transaction after the statement began is not visible
// to it, so Claim then reads the row with [Store.Get]. If the row was
// released, deleted or taken over meanwhile, Claim claims again, at most 3
// times in all.
//
// WARNING: inside a REPEATABLE READ or SERIALIZABLE transaction (see
// [Store.WithDB]) a race with a concurrent claimer fails with PostgreSQL's
// serialization error (SQLSTATE 40001) instead; retry the transaction.
func (s *Store) Claim(ctx context.Context, p idem.ClaimParams) (rec idem.Record, claimed bool, err error) {
	const op = "claim"
	if err := checkClaim(op, &p); err != nil {
		return idem.Record{}, false, err
	}
	if err := s.schema.ready(ctx, s.admit, op, s.table); err != nil {
		return idem.Record{}, false, err
	}
	hold := p.Hold.Microseconds()
	if p.Intent == (idem.Token{}) {
		p.Intent = p.Owner
	}
	for range claimAttempts {
		var res claimRes
		if s.claims != nil {
			res, err = s.claims.do(ctx, claimReq{p: p, hold: hold})
		} else {
			res, err = s.claimOne(ctx, &claimReq{p: p, hold: hold})
		}
		if err == nil && res.exists {
			res, err = s.claimRead(ctx, &claimReq{p: p, hold: hold})
		}
		if err == nil && res.none {
			err = pgx.ErrNoRows
		}
		rec, claimed, takeable := res.rec, res.claimed, res.takeable
		switch {
		case err == nil && !takeable:
			s.newKeys.Observe(!claimed)
			return rec, claimed, nil
		case err == nil:
			// The key's row has expired (this request is a new intent) or
			// was released (this request is the intent's next attempt).
			rec, err = s.scanRecord(s.db.QueryRow(ctx, s.sql.takeover,
				p.Scope, p.Key, p.Fingerprint[:], p.Owner[:], s.retention, p.Intent[:], hold))
			if err == nil {
				s.newKeys.Observe(true)
				return rec, true, nil
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return idem.Record{}, false, translate(op, err)
			}
			// Another claimer took it over first, or the sweeper
			// deleted it: claim again.
			continue
		case !errors.Is(err, pgx.ErrNoRows):
			return idem.Record{}, false, translate(op, err)
		}
		// Another claimer committed the row after our snapshot was taken.
		// A new statement sees it, unless it has been released since.
		rec, err = s.get(ctx, op, p.Scope, p.Key)
		if !errors.Is(err, idem.ErrNotFound) {
			if err == nil {
				s.newKeys.Observe(true)
			}
			return rec, false, err
		}
	}
	return idem.Record{}, false, &opError{op: op, err: fmt.Errorf("gave up after %d attempts: %w", claimAttempts, errContended)}
}

// rowKey names the row of (scope, key) in a map: neither holds a NUL byte
// (checkText).
func rowKey(scope, key string) string { return scope + "\x00" + key }

// claimReq is a claim's first statement to run; claimRes its result.
type claimReq struct {
	p    idem.ClaimParams // checked, with its Intent set
	hold int64            // p.Hold in microseconds
}

type claimRes struct {
	rec               idem.Record
	claimed, takeable bool
	none              bool // claimMany found no row: claimOne's pgx.ErrNoRows
	// exists: the insert statement inserted nothing, the key has a row
	// (claimMany inserting first); the claim statement reads it.
	exists bool
}

// claimOne claims for r alone with the claim statement. Like the statement,
// it returns pgx.ErrNoRows when another claimer committed the key's row
// after the statement began.
//
// While the Store's claims rarely find their key's row, it runs the insert
// statement first, and the claim statement only when that inserted nothing:
// a new key then costs PostgreSQL less, and a key that has a row one more
// round trip, in at most rare.Leave claims of a window before the Store
// reads first again. Both statements decide by the same unique constraint,
// so the outcome is the same either way.
func (s *Store) claimOne(ctx context.Context, r *claimReq) (claimRes, error) {
	if s.newKeys.Rare() {
		var res claimRes
		p := &r.p
		err := s.admit.QueryRow(ctx, s.sql.insert,
			p.Scope, p.Key, p.Fingerprint[:], p.Owner[:], s.retention, p.Intent[:], r.hold).
			Scan(&res.rec.CreatedAt, &res.rec.HoldUntil)
		if err == nil {
			s.inserted(r, &res)
			return res, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return res, err
		}
	}
	return s.claimRead(ctx, r)
}

// claimRead runs the claim statement for r alone.
func (s *Store) claimRead(ctx context.Context, r *claimReq) (claimRes, error) {
	var res claimRes
	p := &r.p
	var err error
	res.rec, err = s.scanRecord(s.admit.QueryRow(ctx, s.sql.claim,
		p.Scope, p.Key, p.Fingerprint[:], p.Owner[:], s.retention, p.Intent[:], r.hold), &res.claimed, &res.takeable)
	return res, err
}

// inserted completes res, whose CreatedAt and HoldUntil the insert
// statement returned, as the record of the row it inserted for r: in
// progress, the intent's first attempt, aged 0 (created at the statement's
// now()), living the Store's retention once answered.
func (s *Store) inserted(r *claimReq, res *claimRes) {
	p := &r.p
	res.claimed = true
	res.rec.Scope, res.rec.Key = p.Scope, p.Key
	res.rec.Fingerprint, res.rec.Owner, res.rec.Intent = p.Fingerprint, p.Owner, p.Intent
	res.rec.Attempt = 1
	res.rec.TTL = time.Duration(s.retention) * time.Microsecond
}

// claimMany runs the claim statement for reqs as one (claimMany), and gives
// each request what claimOne would have: its key's row, or pgx.ErrNoRows.
//
// While the Store inserts first (see claimOne), it runs the insert statement
// over reqs instead: a request whose key has a row comes back with exists
// set, and Claim reads that row with the claim statement, alone.
func (s *Store) claimMany(ctx context.Context, reqs []*claimReq) ([]claimRes, error) {
	n := len(reqs)
	scopes, keys := make([]string, n), make([]string, n)
	hashes, owners, intents := make([][]byte, n), make([][]byte, n), make([][]byte, n)
	holds := make([]int64, n)
	at := make(map[string]int, n)
	for i, r := range reqs {
		scopes[i], keys[i] = r.p.Scope, r.p.Key
		hashes[i], owners[i], intents[i] = r.p.Fingerprint[:], r.p.Owner[:], r.p.Intent[:]
		holds[i] = r.hold
		at[rowKey(r.p.Scope, r.p.Key)] = i
	}
	args := []any{scopes, keys, hashes, owners, s.retention, intents, holds}
	if s.newKeys.Rare() {
		return s.insertMany(ctx, reqs, at, args)
	}
	rows, err := s.admit.Query(ctx, s.sql.claimMany, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	res := make([]claimRes, n)
	found := make([]bool, n)
	for rows.Next() {
		var r claimRes
		if r.rec, err = s.scanRecord(rows, &r.claimed, &r.takeable); err != nil {
			return nil, err
		}
		i, ok := at[rowKey(r.rec.Scope, r.rec.Key)]
		if !ok {
			return nil, fmt.Errorf("claimed the row of a key it was not asked for")
		}
		res[i], found[i] = r, true
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for i := range found {
		res[i].none = !found[i]
	}
	return res, nil
}

// insertMany runs the insert statement over reqs, with claimMany's
// arguments and index of each request by its row's key.
func (s *Store) insertMany(ctx context.Context, reqs []*claimReq, at map[string]int, args []any) ([]claimRes, error) {
	rows, err := s.admit.Query(ctx, s.sql.insertMany, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	res := make([]claimRes, len(reqs))
	for i := range res {
		res[i].exists = true
	}
	for rows.Next() {
		var scope, key string
		var created, hold time.Time
		if err := rows.Scan(&scope, &key, &created, &hold); err != nil {
			return nil, err
		}
		i, ok := at[rowKey(scope, key)]
		if !ok {
			return nil, fmt.Errorf("inserted the row of a key it was not asked for")
		}
		res[i] = claimRes{rec: idem.Record{CreatedAt: created, HoldUntil: hold}}
		s.inserted(reqs[i], &res[i])
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return res, nil
}

// Get returns the live row of a key: in progress (however old) or answered.
// It returns idem.ErrNotFound when there is none, when the row was released
// (no claim holds it: the next Claim takes it over) or when it has expired
// (even if not yet swept).
func (s *Store) Get(ctx context.Context, scope, key string) (idem.Record, error) {
	if err := s.schema.ready(ctx, s.admit, "get", s.table); err != nil {
		return idem.Record{}, err
	}
	return s.get(ctx, "get", scope, key)
}

func (s *Store) get(ctx context.Context, op, scope, key string) (idem.Record, error) {
	if err := checkKey(op, scope, key); err != nil {
		return idem.Record{}, err
	}
	rec, err := s.scanRecord(s.admit.QueryRow(ctx, s.sql.get, scope, key))
	if err != nil {
		return idem.Record{}, translate(op, err)
	}
	return rec, nil
}

// Complete stores the answer of the in-progress row that owner claimed and
// sets its completed_at to now(). It is one statement when it succeeds. When
// nothing was updated, one more statement tells why: idem.ErrNotFound (no
// live row), idem.ErrNotOwner (the row belongs to another owner, finished or
// not) or idem.ErrCompleted (the owner's row already has another answer).
//
// Complete returns once the answer is on disk (its commit waited for the WAL
// flush), unless Config.AsynchronousAnswers says otherwise. Concurrent
// Completes share statements and commits once the Store's statements queue,
// as concurrent Claims do, each kind under a limit of its own.
//
// Complete is idempotent for its owner: when the owner's row already holds
// the same answer (status, headers and body), as after a Complete whose
// commit went through but whose reply was lost, it returns nil. So a caller
// may retry a Complete that failed for an unknown reason.
//
// Under a lease (ctx from [Store.Lead] of the Store's table: the reconciler's
// settle), the write is fenced by it in the same statement and commits
// without sharing: once the lease has passed it changes nothing and returns
// an error wrapping [ErrLeaseLost].
func (s *Store) Complete(ctx context.Context, scope, key string, owner idem.Token, a idem.Response) error {
	const op = "complete"
	if err := checkKey(op, scope, key); err != nil {
		return err
	}
	status, headers, body, err := encodeAnswer(op, a)
	if err != nil {
		return err
	}
	r := answerReq{scope: scope, key: key, owner: owner, status: status, headers: headers, body: body}
	var written bool
	if f, ok := s.fence(ctx); ok {
		args := []any{scope, key, owner[:], status, headers, body, s.retention}
		if s.cfg.Notify {
			written, err = s.writeFenced(ctx, op, f, s.sql.completeFencedNotify, args, s.channel, keyTag(scope, key))
		} else {
			written, err = s.writeFenced(ctx, op, f, s.sql.completeFenced, args)
		}
		if err != nil {
			return err
		}
	} else {
		if s.answers != nil {
			written, err = s.answers.do(ctx, r)
		} else {
			written, err = s.completeOne(ctx, &r)
		}
		if err != nil {
			return translate(op, err)
		}
	}
	if written {
		return nil
	}
	err = s.why(ctx, op, scope, key, owner)
	if errors.Is(err, idem.ErrCompleted) {
		rec, gerr := s.get(ctx, op, scope, key)
		if gerr == nil && rec.Owner == owner && rec.Answer != nil && rec.Answer.Equal(a) {
			return nil
		}
	}
	return err
}

// answerReq is an answer write, encoded (encodeAnswer).
type answerReq struct {
	scope, key    string
	owner         idem.Token
	status        int16
	headers, body []byte
}

// completeOne writes r's answer alone and reports whether it changed the row.
func (s *Store) completeOne(ctx context.Context, r *answerReq) (bool, error) {
	async := s.cfg.AsynchronousAnswers && !s.joined
	write, writeNotify := s.sql.complete, s.sql.completeNotify
	if async {
		write, writeNotify = s.sql.completeAsync, s.sql.completeAsyncNotify
	}
	var (
		tag pgconn.CommandTag
		err error
	)
	if s.cfg.Notify {
		tag, err = s.db.Exec(ctx, writeNotify, r.scope, r.key, r.owner[:], r.status, r.headers, r.body, s.retention,
			s.channel, keyTag(r.scope, r.key))
	} else {
		tag, err = s.db.Exec(ctx, write, r.scope, r.key, r.owner[:], r.status, r.headers, r.body, s.retention)
	}
	return err == nil && tag.RowsAffected() > 0, err
}

// completeMany writes the answers of reqs as one statement (completeMany)
// and reports, for each, whether it changed the row.
func (s *Store) completeMany(ctx context.Context, reqs []*answerReq) ([]bool, error) {
	n := len(reqs)
	scopes, keys, owners := make([]string, n), make([]string, n), make([][]byte, n)
	statuses, headers, bodies := make([]int16, n), make([]string, n), make([][]byte, n)
	at := make(map[string]int, n)
	for i, r := range reqs {
		scopes[i], keys[i], owners[i] = r.scope, r.key, r.owner[:]
		statuses[i], headers[i], bodies[i] = r.status, string(r.headers), r.body
		at[rowKey(r.scope, r.key)] = i
	}
	args := []any{scopes, keys, owners, statuses, headers, bodies, s.retention}
	write := s.sql.completeMany
	switch async := s.cfg.AsynchronousAnswers; {
	case s.cfg.Notify:
		tags := make([]string, n)
		for i, r := range reqs {
			tags[i] = keyTag(r.scope, r.key)
		}
		args = append(args, s.channel, tags)
		write = s.sql.completeManyNotify
		if async {
			write = s.sql.completeManyAsyncNotify
		}
	case async:
		write = s.sql.completeManyAsync
	}
	rows, err := s.db.Query(ctx, write, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	written := make([]bool, n)
	var scope, key string
	for rows.Next() {
		if err := rows.Scan(&scope, &key); err != nil {
			return nil, err
		}
		if i, ok := at[rowKey(scope, key)]; ok {
			written[i] = true
		}
	}
	return written, rows.Err()
}

// Release marks the in-progress row that owner claimed released, saying
// "nothing happened, a retry is safe": the next Claim of the key with the
// same fingerprint wins, as the next attempt of the same intent (Get reports
// the key not found meanwhile); a Claim with another fingerprint still finds
// the row and is refused. The row expires retention after its release. It is
// one statement when it succeeds; otherwise one more tells idem.ErrNotFound
// (also for a row already released), idem.ErrNotOwner and idem.ErrCompleted
// apart, as for [Store.Complete]. Under a lease it is fenced as
// [Store.Complete] is.
func (s *Store) Release(ctx context.Context, scope, key string, owner idem.Token) error {
	const op = "release"
	if err := checkKey(op, scope, key); err != nil {
		return err
	}
	var (
		tag pgconn.CommandTag
		err error
	)
	if f, ok := s.fence(ctx); ok {
		var released bool
		args := []any{scope, key, owner[:], s.retention}
		if s.cfg.Notify {
			released, err = s.writeFenced(ctx, op, f, s.sql.releaseFencedNotify, args, s.channel, keyTag(scope, key))
		} else {
			released, err = s.writeFenced(ctx, op, f, s.sql.releaseFenced, args)
		}
		if err != nil || released {
			return err
		}
		return s.why(ctx, op, scope, key, owner)
	}
	if s.cfg.Notify {
		tag, err = s.db.Exec(ctx, s.sql.releaseNotify, scope, key, owner[:], s.retention, s.channel, keyTag(scope, key))
	} else {
		tag, err = s.db.Exec(ctx, s.sql.release, scope, key, owner[:], s.retention)
	}
	if err != nil {
		return translate(op, err)
	}
	if tag.RowsAffected() > 0 {
		return nil
	}
	return s.why(ctx, op, scope, key, owner)
}

// GiveBack releases the claim p made if it committed although its reply was
// lost (a timeout, a stalled synchronous standby, a connection cut mid
// commit), so that the key is not left in progress with nothing running
// behind it. It waits for a claim of the key still in flight to commit or
// roll back, and when no row holds the key it writes one already released
// under p's fingerprint, which no later arrival of the claim can take: so
// once it returns nil, p's claim can no longer hold the key. It returns
// idem.ErrNotOwner when another claim holds the key, idem.ErrCompleted when
// the key is answered, and idem.ErrNotFound when the row is released
// already (a give-back whose reply was lost, retried). One statement when it
// succeeds.
func (s *Store) GiveBack(ctx context.Context, p idem.ClaimParams) error {
	const op = "give back"
	if err := checkKey(op, p.Scope, p.Key); err != nil {
		return err
	}
	var (
		tag pgconn.CommandTag
		err error
	)
	if s.cfg.Notify {
		tag, err = s.db.Exec(ctx, s.sql.giveBackNotify, p.Scope, p.Key, p.Fingerprint[:], p.Owner[:], s.retention, s.channel, keyTag(p.Scope, p.Key))
	} else {
		tag, err = s.db.Exec(ctx, s.sql.giveBack, p.Scope, p.Key, p.Fingerprint[:], p.Owner[:], s.retention)
	}
	if err != nil {
		return translate(op, err)
	}
	if tag.RowsAffected() > 0 {
		return nil
	}
	return s.why(ctx, op, p.Scope, p.Key, p.Owner)
}

// why runs after an update or delete of an in-progress row matched nothing,
// and tells the caller why.
func (s *Store) why(ctx context.Context, op, scope, key string, owner idem.Token) error {
	var (
		got  []byte
		done bool
	)
	err := s.db.QueryRow(ctx, s.sql.inspect, scope, key).Scan(&got, &done)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return &opError{op: op, kind: idem.ErrNotFound}
	case err != nil:
		return translate(op, err)
	case !bytes.Equal(got, owner[:]):
		return &opError{op: op, kind: idem.ErrNotOwner}
	case done:
		return &opError{op: op, kind: idem.ErrCompleted}
	default:
		// The row was absent when the first statement ran and has been
		// claimed since: as far as that statement could tell, not found.
		return &opError{op: op, kind: idem.ErrNotFound}
	}
}

// sweepBatch deletes up to limit expired rows created at or after from (the
// zero time: from the oldest), and returns how many it deleted and the
// newest created_at among them, where the next batch goes on from.
func (s *Store) sweepBatch(ctx context.Context, op string, limit int, from time.Time) (int64, time.Time, error) {
	if limit < 1 {
		return 0, from, invalid(op, fmt.Sprintf("limit %d is not positive", limit))
	}
	if err := s.schema.ready(ctx, s.db, op, s.table); err != nil {
		return 0, from, err
	}
	start := pgtype.Timestamptz{Time: from, Valid: true}
	if from.IsZero() {
		start.InfinityModifier = pgtype.NegativeInfinity
	}
	rows, err := s.db.Query(ctx, s.sql.sweepBatch, s.retention, limit, start)
	if err != nil {
		return 0, from, translate(op, err)
	}
	var n int64
	newest := from
	for rows.Next() {
		var created time.Time
		if err := rows.Scan(&created); err != nil {
			rows.Close()
			return n, newest, translate(op, err)
		}
		n++
		if created.After(newest) {
			newest = created
		}
	}
	return n, newest, translate(op, rows.Err())
}

func checkKey(op, scope, key string) error {
	if err := checkText(op, "scope", scope); err != nil {
		return err
	}
	return checkText(op, "key", key)
}

// encodeAnswer turns a into the parameters of the answer columns: a nil
// Header is stored as {} and a nil Body as an empty bytea.
func encodeAnswer(op string, a idem.Response) (status int16, headers, body []byte, err error) {
	if a.Status < 100 || a.Status > 599 {
		return 0, nil, nil, invalid(op, fmt.Sprintf("status %d is outside 100..599", a.Status))
	}
	h := a.Header
	if h == nil {
		h = http.Header{}
	}
	for name, values := range h {
		if !utf8.ValidString(name) {
			return 0, nil, nil, invalid(op, "a header name is not valid UTF-8")
		}
		for _, v := range values {
			if !utf8.ValidString(v) {
				// JSON would store U+FFFD instead: a replay would differ
				// from the answer, and a retried write would not match.
				return 0, nil, nil, invalid(op, "a value of header "+name+" is not valid UTF-8: it cannot be stored byte for byte")
			}
		}
	}
	headers, err = json.Marshal(h)
	if err != nil {
		return 0, nil, nil, &opError{op: op, kind: idem.ErrInvalid, err: err}
	}
	body = a.Body
	if body == nil {
		body = []byte{}
	}
	return int16(a.Status), headers, body, nil
}

// scanRecord reads a row selected with columns, followed by extra.
func (s *Store) scanRecord(row pgx.Row, extra ...any) (idem.Record, error) {
	var (
		rec                 idem.Record
		hash, owner, intent []byte
		status              *int16
		headers             []byte
		body                []byte
		completedAt         *time.Time
		releasedAt          *time.Time
		attempt             int32
		retention           time.Duration
		dbNow               time.Time
	)
	dest := append([]any{&rec.Scope, &rec.Key, &hash, &owner, &status,
		&headers, &body, &rec.CreatedAt, &completedAt, &intent, &attempt, &rec.HoldUntil, &releasedAt, &retention, &dbNow}, extra...)
	if err := row.Scan(dest...); err != nil {
		return idem.Record{}, err
	}
	// A row lives its own retention after its answer or release; a row in
	// progress never expires, and its answer, written later, will live at
	// least its retention from now.
	rec.TTL = retention
	switch {
	case completedAt != nil:
		rec.TTL = completedAt.Add(retention).Sub(dbNow)
	case releasedAt != nil:
		rec.TTL = releasedAt.Add(retention).Sub(dbNow)
		rec.ReleasedAt = *releasedAt
	}
	if len(hash) != len(rec.Fingerprint) || len(owner) != len(rec.Owner) || len(intent) != len(rec.Intent) {
		return idem.Record{}, fmt.Errorf("row has a %d-byte request_hash, a %d-byte owner_token and a %d-byte intent_id",
			len(hash), len(owner), len(intent))
	}
	copy(rec.Fingerprint[:], hash)
	copy(rec.Owner[:], owner)
	copy(rec.Intent[:], intent)
	rec.Attempt = int(attempt)
	rec.Age = dbNow.Sub(rec.CreatedAt)
	if status == nil {
		return rec, nil
	}
	a := &idem.Response{Status: int(*status), Header: http.Header{}, Body: body}
	if a.Body == nil {
		a.Body = []byte{}
	}
	if len(headers) > 0 {
		if err := json.Unmarshal(headers, &a.Header); err != nil {
			return idem.Record{}, fmt.Errorf("response_headers: %w", err)
		}
		if a.Header == nil { // the JSON null
			a.Header = http.Header{}
		}
	}
	rec.Answer = a
	if completedAt != nil {
		rec.CompletedAt = *completedAt
	}
	return rec, nil
}
