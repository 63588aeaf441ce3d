package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemguard/idem"
)

// Payment methods with a scripted behaviour. Any other method starting with
// "pm_" is charged successfully.
const (
	// PMDeclined is always declined; no money moves.
	PMDeclined = "pm_declined"
	// PMTimeout is charged, but the answer never reaches the caller: Charge
	// performs the charge and then reports ErrTimeout, as a real client does
	// when its read times out after the provider has already acted.
	PMTimeout = "pm_timeout"
)

// Errors of Payrail.Charge. Compare with errors.Is.
var (
	// ErrDeclined: the payment method was declined. Nothing was charged.
	ErrDeclined = errors.New("payrail: card declined")
	// ErrTimeout: the call timed out and its outcome is unknown to the caller.
	// (In this fake the charge was performed: ask Lookup.)
	ErrTimeout = errors.New("payrail: timed out waiting for the provider; the charge may have been made")
	// ErrKeyReused: the idempotency key was first used with other parameters.
	ErrKeyReused = errors.New("payrail: idempotency key reused with different parameters")
)

// ChargeStatus is the state of a charge attempt.
type ChargeStatus string

// Charge statuses.
const (
	ChargeSucceeded ChargeStatus = "succeeded"
	ChargeDeclined  ChargeStatus = "declined"
)

// ChargeRequest is what the caller asks Payrail to charge.
type ChargeRequest struct {
	Amount        int64  // in minor units (cents)
	Currency      string // ISO 4217, e.g. "EUR"
	PaymentMethod string
}

// Charge is the provider's record of one charge attempt under one
// idempotency key.
type Charge struct {
	ID            string       `json:"id"`
	Key           string       `json:"idempotency_key"`
	Amount        int64        `json:"amount"`
	Currency      string       `json:"currency"`
	PaymentMethod string       `json:"payment_method"`
	Status        ChargeStatus `json:"status"`
	CreatedAt     time.Time    `json:"created"`
}

// Outcomes of a Charge call, as recorded in the attempts table.
const (
	attemptCharged   = "charged"    // first call with its key: succeeded (or timed out after charging)
	attemptDeclined  = "declined"   // first call with its key: declined
	attemptReplayed  = "replayed"   // a later call, same parameters: the first outcome again
	attemptKeyReused = "key_reused" // a later call, other parameters: refused
)

// providerTimeout bounds the provider's own work once a call has reached it
// (after the latency). That work is detached from the caller's context: a
// provider that has received a call acts whether or not its caller is still
// waiting.
const providerTimeout = 10 * time.Second

// Payrail is a fake payment provider. Like a real one (Stripe, Adyen) it is
// idempotent on the key its caller sends: the first call with a key decides
// the outcome, every later call with that key gets the same outcome and never
// charges again. It counts the charges it performs and the calls it receives,
// so that a test or a curious human can check that a guarded endpoint charged
// exactly once, and see how many times the work ran.
//
// Its state lives in PostgreSQL, in tables of its own (payrail_charges,
// payrail_attempts), because a real provider outlives the service that calls
// it: a service killed after a charge must find that charge when it comes
// back. Every Payrail over the same database and schema is the same provider,
// as several instances of a service share one real provider.
//
// Every Charge call takes the configured latency. If the caller's context ends
// before that, the call fails with the context's error and the fake performs
// nothing and counts nothing (a simplification: a real provider might have
// acted anyway).
//
// The zero value is not usable; call NewPayrail. A Payrail is safe for
// concurrent use, by any number of processes.
type Payrail struct {
	pool     *pgxpool.Pool
	latency  time.Duration
	charges  string // quoted, schema-qualified when a schema is set
	attempts string // likewise
}

// NewPayrail creates the provider's tables in schema (the connection's
// current schema when empty) if needed, under an advisory lock so that
// instances starting together do not race, and returns a provider whose calls
// each take latency.
func NewPayrail(ctx context.Context, pool *pgxpool.Pool, schema string, latency time.Duration) (*Payrail, error) {
	if pool == nil {
		return nil, errors.New("payrail: nil pool")
	}
	if latency < 0 {
		return nil, fmt.Errorf("payrail: negative latency %v", latency)
	}
	table := func(name string) string {
		if schema == "" {
			return pgx.Identifier{name}.Sanitize()
		}
		return pgx.Identifier{schema, name}.Sanitize()
	}
	p := &Payrail{
		pool:     pool,
		latency:  latency,
		charges:  table("payrail_charges"),
		attempts: table("payrail_attempts"),
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('payrail:' || $1))`, p.charges); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+p.charges+` (
	idempotency_key text        PRIMARY KEY,
	id              text        NOT NULL UNIQUE,
	amount          bigint      NOT NULL,
	currency        text        NOT NULL,
	payment_method  text        NOT NULL,
	status          text        NOT NULL CHECK (status IN ('succeeded', 'declined')),
	created_at      timestamptz NOT NULL DEFAULT now()
)`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+p.attempts+` (
	id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	idempotency_key text        NOT NULL,
	outcome         text        NOT NULL,
	created_at      timestamptz NOT NULL DEFAULT now()
)`)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("payrail tables: %w", err)
	}
	return p, nil
}

const chargeColumns = `id, idempotency_key, amount, currency, payment_method, status, created_at`

func scanCharge(row pgx.Row) (Charge, error) {
	var c Charge
	err := row.Scan(&c.ID, &c.Key, &c.Amount, &c.Currency, &c.PaymentMethod, &c.Status, &c.CreatedAt)
	c.CreatedAt = c.CreatedAt.UTC()
	return c, err
}

// Charge charges req under the idempotency key key, at most once per key.
//
// The first call with a key succeeds (and counts one charge), or returns
// ErrDeclined for PMDeclined (no charge), or, for PMTimeout, charges and then
// returns ErrTimeout. A later call with the same key and parameters returns
// the first call's charge (or ErrDeclined again) without charging; with other
// parameters it returns ErrKeyReused. Every call that reaches the provider
// (after the latency) counts as one attempt, whatever its outcome.
//
// Any other error (the database failed) leaves the outcome unknown, as a
// network error would with a real provider: ask Lookup.
func (p *Payrail) Charge(ctx context.Context, key string, req ChargeRequest) (Charge, error) {
	if key == "" {
		return Charge{}, errors.New("payrail: empty idempotency key")
	}
	t := time.NewTimer(p.latency)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return Charge{}, fmt.Errorf("payrail: charge: %w", ctx.Err())
	case <-t.C:
	}

	// The call has reached the provider: it acts whatever its caller does now.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), providerTimeout)
	defer cancel()
	status := ChargeSucceeded
	if req.PaymentMethod == PMDeclined {
		status = ChargeDeclined
	}
	var (
		c        Charge
		inserted bool
		outcome  string
	)
	err := pgx.BeginFunc(wctx, p.pool, func(tx pgx.Tx) error {
		// The insert decides: of concurrent first calls, one inserts and the
		// others wait for it to commit, then insert nothing.
		var err error
		c, err = scanCharge(tx.QueryRow(wctx, `
INSERT INTO `+p.charges+` (id, idempotency_key, amount, currency, payment_method, status)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING `+chargeColumns,
			newID("ch_"), key, req.Amount, req.Currency, req.PaymentMethod, status))
		switch {
		case err == nil:
			inserted = true
			outcome = attemptCharged
			if status == ChargeDeclined {
				outcome = attemptDeclined
			}
		case errors.Is(err, pgx.ErrNoRows):
			// The key was decided before. A statement of its own, so that
			// its snapshot (READ COMMITTED) sees the row the insert waited for.
			c, err = scanCharge(tx.QueryRow(wctx, `SELECT `+chargeColumns+` FROM `+p.charges+` WHERE idempotency_key = $1`, key))
			if err != nil {
				return err
			}
			outcome = attemptReplayed
			if c.Amount != req.Amount || c.Currency != req.Currency || c.PaymentMethod != req.PaymentMethod {
				outcome = attemptKeyReused
			}
		default:
			return err
		}
		_, err = tx.Exec(wctx, `INSERT INTO `+p.attempts+` (idempotency_key, outcome) VALUES ($1, $2)`, key, outcome)
		return err
	})
	if err != nil {
		return Charge{}, fmt.Errorf("payrail: charge: %w", err)
	}
	switch {
	case outcome == attemptKeyReused:
		return Charge{}, ErrKeyReused
	case c.Status == ChargeDeclined:
		return Charge{}, ErrDeclined
	case inserted && req.PaymentMethod == PMTimeout:
		return Charge{}, ErrTimeout
	}
	return c, nil
}

// Lookup returns the charge attempt made under key, succeeded or declined,
// and whether there was one. It is what a reconciler asks after a timeout. An
// error means the answer is unknown, not that there was no charge.
func (p *Payrail) Lookup(ctx context.Context, key string) (Charge, bool, error) {
	c, err := scanCharge(p.pool.QueryRow(ctx, `SELECT `+chargeColumns+` FROM `+p.charges+` WHERE idempotency_key = $1`, key))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Charge{}, false, nil
	case err != nil:
		return Charge{}, false, fmt.Errorf("payrail: lookup: %w", err)
	}
	return c, true, nil
}

// Count returns the number of charges performed so far (declines excluded),
// by every Payrail sharing the database.
func (p *Payrail) Count(ctx context.Context) (int, error) {
	n, _, err := p.counts(ctx)
	return n, err
}

// Attempts returns the number of Charge calls that reached the provider so
// far (after the latency), by every Payrail sharing the database, whatever
// their outcome: charges, declines, replays and refused key reuses.
func (p *Payrail) Attempts(ctx context.Context) (int, error) {
	_, n, err := p.counts(ctx)
	return n, err
}

// counts returns Count and Attempts from one snapshot, so that attempts is
// never below count.
func (p *Payrail) counts(ctx context.Context) (count, attempts int, err error) {
	err = p.pool.QueryRow(ctx, `SELECT
	(SELECT count(*) FROM `+p.charges+` WHERE status = 'succeeded'),
	(SELECT count(*) FROM `+p.attempts+`)`).Scan(&count, &attempts)
	if err != nil {
		return 0, 0, fmt.Errorf("payrail: counts: %w", err)
	}
	return count, attempts, nil
}

// serveCount answers GET /payrail/charges with {"count": N, "attempts": M}:
// the charges performed and the charge calls received.
func (p *Payrail) serveCount(w http.ResponseWriter, r *http.Request) {
	count, attempts, err := p.counts(r.Context())
	if err != nil {
		idem.Problem{
			Type: problemBase + problemUnavailable, Title: "Service unavailable", Status: http.StatusServiceUnavailable,
			Detail: "The payment provider's counters could not be read.", Slug: problemUnavailable, Err: err,
		}.Write(w)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Count    int `json:"count"`
		Attempts int `json:"attempts"`
	}{count, attempts})
}

// newID returns prefix followed by 20 random lowercase base32 characters
// (100 bits).
func newID(prefix string) string {
	return prefix + strings.ToLower(rand.Text()[:20])
}

// writeJSON writes v as the JSON body of a status answer.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	body = append(body, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
