package pgtest_test

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/idemtest/pgtest"
)

// createOrder stands for a handler under test: it writes the order and its
// answer in one transaction (idem.Complete), failing with 500 when the
// payment method is "pm_fail" after writing the order, so that the
// transaction rolls back.
func createOrder(pool *pgxpool.Pool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		intent := idem.ExecutionFromContext(ctx).Intent
		orderID := idem.DeriveID("ord_", "order", intent)
		resp := idem.Response{Status: http.StatusCreated, Header: http.Header{"Location": {"/orders/" + orderID}}}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO orders (public_id) VALUES ($1)`, orderID); err != nil {
				return err
			}
			if r.URL.Query().Get("pm") == "pm_fail" {
				return errors.New("payment failed after the order was written")
			}
			return idem.Complete(ctx, tx, resp)
		})
		if err != nil {
			http.Error(w, "order not recorded", http.StatusInternalServerError)
			return
		}
		resp.Write(w)
	}
}

func post(h http.Handler, key, target string) *http.Response {
	req := httptest.NewRequest(http.MethodPost, target, strings.NewReader(`{"sku":"A1"}`))
	req.Header.Set("Authorization", "Bearer user-42")
	req.Header.Set(idem.HeaderKey, key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w.Result()
}

func userScope(r *http.Request) (string, bool) {
	return strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
}

// A test of a handler that joins its answer to its own transaction: the
// order and the answer commit together, a retry replays the answer, and a
// rolled-back transaction stores neither.
func TestJoinedHandler(t *testing.T) {
	t.Parallel()
	store, pool := pgtest.Store(t, nil) // a schema of the test's own, dropped at its end
	_, err := pool.Exec(t.Context(), `CREATE TABLE orders (public_id text PRIMARY KEY)`)
	require.NoError(t, err)
	guard, err := idem.New(store, &idem.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	h := guard.Middleware(userScope, nil)(createOrder(pool))

	first := post(h, "key-1", "/orders")
	require.Equal(t, http.StatusCreated, first.StatusCode)
	retry := post(h, "key-1", "/orders")
	require.Equal(t, http.StatusCreated, retry.StatusCode)
	require.Equal(t, "true", retry.Header.Get(idem.HeaderReplayed))
	require.Equal(t, first.Header.Get("Location"), retry.Header.Get("Location"))

	require.Equal(t, http.StatusInternalServerError, post(h, "key-2", "/orders?pm=pm_fail").StatusCode)
	require.Equal(t, http.StatusConflict, post(h, "key-2", "/orders?pm=pm_fail").StatusCode, "in progress until reconciled")

	var orders int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM orders`).Scan(&orders))
	require.Equal(t, 1, orders, "the rolled-back order is not there")
}

// Each call is a schema of its own: two stores do not see each other's
// keys, and unqualified names resolve to the test's schema.
func TestStoresAreIsolated(t *testing.T) {
	t.Parallel()
	a, poolA := pgtest.Store(t, nil)
	b, _ := pgtest.Store(t, nil)
	require.NotEqual(t, a.Table(), b.Table())
	var path string
	require.NoError(t, poolA.QueryRow(t.Context(), `SELECT current_schema()`).Scan(&path))
	require.True(t, strings.HasPrefix(a.Table(), `"`+path+`".`), "the pool's search_path is the store's schema: %s in %s", a.Table(), path)
}
