package target

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemguard/idem"
)

// minimalDDL creates the minimal table {t}: what an idempotency key needs
// and nothing more. No CHECK constraints, no partial index, no
// completed_at, no reconcile columns; one index on created_at, which any
// store that expires keys needs.
const minimalDDL = `
CREATE TABLE {t} (
	user_id          text,
	key              text,
	request_hash     bytea,
	owner_token      bytea,
	response_status  smallint,
	response_headers jsonb,
	response_body    bytea,
	created_at       timestamptz DEFAULT now(),
	PRIMARY KEY (user_id, key)
);
CREATE INDEX ON {t} (created_at);`

// minimalStatements is the minimal SQL for table t: a claim that inserts or
// does nothing, a read by primary key, and an owner-checked answer write. No
// CTE, no expiry: a row is never taken over.
type minimalStatements struct {
	claim, get, complete string
}

func newMinimalStatements(t string) minimalStatements {
	return minimalStatements{
		// $1 scope, $2 key, $3 fingerprint, $4 owner. A row back means
		// this request inserted it; created_at is what a guard needs to
		// tell a live claim from an abandoned one.
		claim: `INSERT INTO ` + t + ` (user_id, key, request_hash, owner_token) VALUES ($1, $2, $3, $4)
ON CONFLICT (user_id, key) DO NOTHING RETURNING created_at`,
		// $1 scope, $2 key: the row that stopped the claim, with the answer
		// to replay.
		get: `SELECT request_hash, response_status, response_headers, response_body FROM ` + t + `
WHERE user_id = $1 AND key = $2`,
		// $1 scope, $2 key, $3 owner, $4 status, $5 headers, $6 body.
		complete: `UPDATE ` + t + ` SET response_status = $4, response_headers = $5, response_body = $6
WHERE user_id = $1 AND key = $2 AND owner_token = $3`,
	}
}

// createMinimalTable creates the minimal table in env's schema.
func createMinimalTable(ctx context.Context, env *Env) error {
	t := pgx.Identifier{env.Schema, MinimalTable}.Sanitize()
	_, err := env.Pool.Exec(ctx, strings.ReplaceAll(minimalDDL, "{t}", t))
	if err != nil {
		return fmt.Errorf("create %s: %w", MinimalTable, err)
	}
	return nil
}

// minimal is the floor under the ceiling: the same job (at most one
// execution per key, the answer stored and replayed, a reused key refused)
// done with the least SQL on the least schema, issued like the ceiling's
// (raw values, nothing decoded beyond a decision's needs). The ceiling over
// it is the cost of the store's SQL and schema (the claim's CTE that returns
// the live row with its expiry, the answer's owner, expiry and "no answer
// yet" checks, the reconciler's partial index and columns, completed_at)
// against the bare job.
type minimal struct {
	env     *Env
	hybrid  bool
	work    func(context.Context) error
	sql     minimalStatements
	headers []byte
	prefix  string
	tokens  atomic.Uint64
}

func newMinimal(env *Env, strategy string, work func(context.Context) error) (Target, error) {
	if strategy != Table && strategy != Hybrid {
		return nil, fmt.Errorf("unknown strategy %q (want table or hybrid)", strategy)
	}
	headers, err := json.Marshal(answerHeader)
	if err != nil {
		return nil, err
	}
	return &minimal{
		env:     env,
		hybrid:  strategy == Hybrid,
		work:    work,
		sql:     newMinimalStatements(pgx.Identifier{env.Schema, MinimalTable}.Sanitize()),
		headers: headers,
		prefix:  env.Prefix + "minimal:",
	}, nil
}

func (m *minimal) Table() string { return MinimalTable }

func (m *minimal) Do(ctx context.Context, req idem.Request) (string, error) {
	if m.hybrid {
		return m.doHybrid(ctx, req)
	}
	return m.doTable(ctx, req)
}

// doTable: INSERT ... ON CONFLICT DO NOTHING; when it inserted nothing, a
// SELECT by key decides; when it inserted, the work, then the answer.
func (m *minimal) doTable(ctx context.Context, req idem.Request) (string, error) {
	owner := nextToken(&m.tokens)
	r, err := queryRow(ctx, m.env, m.sql.claim, req.Scope, req.Key, req.Fingerprint[:], owner[:])
	if err != nil {
		return "", err
	}
	if !r.found {
		return m.get(ctx, req)
	}
	if err := m.work(ctx); err != nil {
		return "", err
	}
	_, err = m.env.PGStatements.Exec(context.WithoutCancel(ctx), m.sql.complete, req.Scope, req.Key, owner[:],
		int16(http.StatusCreated), m.headers, answerBody)
	if err != nil {
		return "", err
	}
	return idem.OutcomeExecuted.String(), nil
}

// get reads the row of a key that is taken and decides.
func (m *minimal) get(ctx context.Context, req idem.Request) (string, error) {
	r, err := queryRow(ctx, m.env, m.sql.get, req.Scope, req.Key)
	switch {
	case err != nil:
		return "", err
	case !r.found:
		// ON CONFLICT DO NOTHING waited for the conflicting insert to
		// commit, and rows are never deleted here: not reached.
		return idem.OutcomeInProgress.String(), nil
	}
	return decide(r, req.Fingerprint), nil
}

// doHybrid: SET NX EX first (the lease is kept until its TTL); a refused
// SET NX reads the row by key, and claims when there is none. It is the
// hybrid protocol before the lease carried the key's state: the least SQL,
// not the least PostgreSQL work, which the guard's hybrid now beats on
// every duplicate (TestMinimalAgrees pins both).
func (m *minimal) doHybrid(ctx context.Context, req idem.Request) (string, error) {
	owner := nextToken(&m.tokens)
	ok, err := m.env.Redis.SetNX(ctx, m.prefix+req.Scope+":"+req.Key, owner[:], 30*time.Second).Result()
	if err != nil {
		return "", err
	}
	if !ok {
		r, err := queryRow(ctx, m.env, m.sql.get, req.Scope, req.Key)
		switch {
		case err != nil:
			return "", err
		case r.found:
			return decide(r, req.Fingerprint), nil
		}
	}
	return m.doTable(ctx, req)
}
