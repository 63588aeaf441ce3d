package target

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
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
