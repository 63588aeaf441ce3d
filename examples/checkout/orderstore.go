package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemguard/idem/durable"
)

// orderStore keeps orders in PostgreSQL, in the table checkout_orders beside
// idem's table, so that an order's final state and the stored answer can
// commit in one transaction.
type orderStore struct {
	pool  *pgxpool.Pool
	table string // quoted, schema-qualified when a schema is set
}

// newOrderStore creates the orders table if needed (under an advisory lock,
// so that instances starting together do not race) and returns the store.
func newOrderStore(ctx context.Context, pool *pgxpool.Pool, schema string) (*orderStore, error) {
	s := &orderStore{pool: pool, table: pgx.Identifier{"checkout_orders"}.Sanitize()}
	if schema != "" {
		s.table = pgx.Identifier{schema, "checkout_orders"}.Sanitize()
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('checkout_orders:' || $1))`, s.table); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+s.table+` (
	id              text        PRIMARY KEY,
	user_id         text        NOT NULL,
	idempotency_key text        NOT NULL,
	status          text        NOT NULL,
	hold_ids        bigint[]    NOT NULL,
	payment_method  text        NOT NULL,
	amount          bigint      NOT NULL,
	charge_id       text,
	created_at      timestamptz NOT NULL DEFAULT now(),
	updated_at      timestamptz NOT NULL DEFAULT now()
)`)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("orders table: %w", err)
	}
	return s, nil
}

const orderColumns = `id, user_id, idempotency_key, status, hold_ids, payment_method, amount, coalesce(charge_id, '')`

func scanOrder(row pgx.Row) (Order, error) {
	var o Order
	err := row.Scan(&o.ID, &o.owner, &o.idempotencyKey, &o.Status, &o.HoldIDs, &o.paymentMethod, &o.amount, &o.ChargeID)
	return o, err
}

// create inserts o and returns it, or returns the order already stored under
// its id: another execution of the same intent created it (the id is derived
// from the intent), and its state wins.
func (s *orderStore) create(ctx context.Context, o Order) (Order, error) {
	row := s.pool.QueryRow(ctx, `
WITH ins AS (
	INSERT INTO `+s.table+` (id, user_id, idempotency_key, status, hold_ids, payment_method, amount)
	VALUES ($1, $2, $3, $4, $5, $6, $7)
	ON CONFLICT (id) DO NOTHING
	RETURNING `+orderColumns+`
)
SELECT * FROM ins
UNION ALL
SELECT `+orderColumns+` FROM `+s.table+` WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM ins)`,
		o.ID, o.owner, o.idempotencyKey, o.Status, o.HoldIDs, o.paymentMethod, o.amount)
	got, err := scanOrder(row)
	if err != nil {
		return Order{}, fmt.Errorf("create order: %w", err)
	}
	return got, nil
}

// update records o's status and charge through db: the pool, or the
// transaction that also stores the answer.
func (s *orderStore) update(ctx context.Context, db durable.DB, o Order) error {
	tag, err := db.Exec(ctx, `UPDATE `+s.table+` SET status = $2, charge_id = nullif($3, ''), updated_at = now() WHERE id = $1`,
		o.ID, o.Status, o.ChargeID)
	if err != nil {
		return fmt.Errorf("update order: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("update order %s: not found", o.ID)
	}
	return nil
}

// errOrderMoved says that an order is no longer in the status a transition
// was decided from, nor in the one it leads to.
var errOrderMoved = errors.New("the order moved on meanwhile")

// transition moves o to its status and charge from the status from, which
// the caller read, as one compare-and-set: the reconciler's writes. Its
// resolver may run twice at once across a fleet, or late (a reconciler paused
// past its lease, whose decision idem then drops), and must never overwrite
// what the intent's next attempt wrote since, such as mark abandoned an order
// that attempt paid. An order already in o's state (another run got there
// first) is left so, without error; any other state fails with errOrderMoved.
func (s *orderStore) transition(ctx context.Context, o Order, from OrderStatus) error {
	tag, err := s.pool.Exec(ctx, `UPDATE `+s.table+` SET status = $2, charge_id = nullif($3, ''), updated_at = now()
WHERE id = $1 AND (status = $4 OR (status = $2 AND charge_id IS NOT DISTINCT FROM nullif($3, '')))`,
		o.ID, o.Status, o.ChargeID, from)
	if err != nil {
		return fmt.Errorf("update order: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("update order %s from %s to %s: %w", o.ID, from, o.Status, errOrderMoved)
	}
	return nil
}

// get returns the order with that id, and whether it exists.
func (s *orderStore) get(ctx context.Context, id string) (Order, bool, error) {
	o, err := scanOrder(s.pool.QueryRow(ctx, `SELECT `+orderColumns+` FROM `+s.table+` WHERE id = $1`, id))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Order{}, false, nil
	case err != nil:
		return Order{}, false, fmt.Errorf("get order: %w", err)
	}
	return o, true, nil
}
