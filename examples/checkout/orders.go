package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/idemguard/idem"
)

// Problem type slugs of the checkout's own answers, appended to problemBase.
// (The guard's own refusals use idem's slugs under the same base.)
const (
	problemInvalidOrder   = "invalid-order"   // 400, stored and replayed
	problemCardDeclined   = "card-declined"   // 402, stored and replayed
	problemPaymentTimeout = "payment-timeout" // 504, not stored: the key stays in progress
	problemOrderNotFound  = "order-not-found" // 404
)

const (
	// pricePerHold is what one held seat costs, in euro cents.
	pricePerHold = 4500
	// maxHolds bounds the holds of one order.
	maxHolds = 50
	// paymentTimeout bounds the call to the payment provider. In hybrid mode
	// the guard's own, earlier deadline (before the Redis lease expires) wins.
	paymentTimeout = 10 * time.Second
)

// OrderStatus is the state of an order.
type OrderStatus string

// Order statuses.
const (
	OrderPendingPayment OrderStatus = "pending_payment" // created, charge not answered yet
	OrderPaid           OrderStatus = "paid"
	OrderDeclined       OrderStatus = "declined"
	OrderPaymentUnknown OrderStatus = "payment_unknown" // the charge timed out: a reconciler must ask the provider
)

// Order is a checkout of seat holds. The exported fields are its JSON form.
type Order struct {
	ID       string      `json:"id"`
	Status   OrderStatus `json:"status"`
	HoldIDs  []int64     `json:"hold_ids"`
	ChargeID string      `json:"charge_id,omitempty"`

	owner          string // the user id (the guard's scope)
	idempotencyKey string // the client's key, for a reconciler
	paymentMethod  string
	amount         int64
}

// paymentKey is the idempotency key the order's charge is sent to the
// provider with, derived from the order so that every call about this order,
// including a reconciler's, names the same charge.
func (o *Order) paymentKey() string { return "order-" + o.ID }

// orderBook keeps orders in memory. It is safe for concurrent use; it stores
// and returns copies.
type orderBook struct {
	mu     sync.Mutex
	orders map[string]Order
}

func (b *orderBook) put(o Order) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.orders == nil {
		b.orders = map[string]Order{}
	}
	b.orders[o.ID] = o
}

func (b *orderBook) get(id string) (Order, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	o, ok := b.orders[id]
	return o, ok
}

// checkout serves the order endpoints.
type checkout struct {
	payrail *Payrail
	orders  orderBook
	render  idem.ProblemRenderer
	log     *slog.Logger
}

// createOrderRequest is the body of POST /orders.
type createOrderRequest struct {
	HoldIDs       []int64 `json:"hold_ids"`
	PaymentMethod string  `json:"payment_method"`
}

// createOrder serves POST /orders behind the idem middleware: whatever it
// answers below 500 is stored and replayed to every retry with the same
// Idempotency-Key; a 5xx leaves the key in progress.
func (c *checkout) createOrder(w http.ResponseWriter, r *http.Request) {
	user, ok := bearerUser(r) // the middleware's ScopeFunc already required it
	if !ok {
		c.problem(w, r, http.StatusUnauthorized, idem.ProblemUnauthenticated, "Authentication required",
			"Send Authorization: Bearer <user-id>.")
		return
	}
	in, detail := decodeOrder(r.Body)
	if detail != "" {
		c.problem(w, r, http.StatusBadRequest, problemInvalidOrder, "Invalid order", detail)
		return
	}
	key, _ := idem.ParseKey(r.Header.Values(idem.HeaderKey)) // valid: the middleware parsed it
	o := Order{
		ID:             newID("ord_"),
		Status:         OrderPendingPayment,
		HoldIDs:        in.HoldIDs,
		owner:          user,
		idempotencyKey: key,
		paymentMethod:  in.PaymentMethod,
		amount:         int64(len(in.HoldIDs)) * pricePerHold,
	}
	c.orders.put(o)

	ctx, cancel := paymentContext(r.Context())
	defer cancel()
	ch, err := c.payrail.Charge(ctx, o.paymentKey(), ChargeRequest{
		Amount: o.amount, Currency: "EUR", PaymentMethod: o.paymentMethod,
	})
	switch {
	case errors.Is(err, ErrDeclined):
		o.Status = OrderDeclined
		c.orders.put(o)
		c.problem(w, r, http.StatusPaymentRequired, problemCardDeclined, "Card declined",
			"The payment method was declined. Nothing was charged. To pay with another method, send a new request with a new Idempotency-Key.")
	case err != nil:
		// The charge may or may not have happened. Answer 5xx so that the
		// guard leaves the key in progress: a retry gets 409 instead of a
		// second order and a second charge, until the outcome is known.
		o.Status = OrderPaymentUnknown
		c.orders.put(o)
		c.log.LogAttrs(r.Context(), slog.LevelWarn, "checkout: payment outcome unknown",
			slog.String("order", o.ID), slog.String("payment_key", o.paymentKey()), slog.Any("error", err))
		c.problem(w, r, http.StatusGatewayTimeout, problemPaymentTimeout, "Payment provider timed out",
			"The payment provider did not answer in time; the charge may have been made. Retrying with the same Idempotency-Key is safe: it answers 409 until the outcome is known.")
	default:
		o.Status = OrderPaid
		o.ChargeID = ch.ID
		c.orders.put(o)
		w.Header().Set("Location", "/orders/"+o.ID)
		writeJSON(w, http.StatusCreated, o)
	}
}

// getOrder serves GET /orders/{id}: the order, to its owner only.
func (c *checkout) getOrder(w http.ResponseWriter, r *http.Request) {
	user, ok := bearerUser(r)
	if !ok {
		c.problem(w, r, http.StatusUnauthorized, idem.ProblemUnauthenticated, "Authentication required",
			"Send Authorization: Bearer <user-id>.")
		return
	}
	o, ok := c.orders.get(r.PathValue("id"))
	if !ok || o.owner != user {
		// Someone else's order is as absent as a missing one.
		c.problem(w, r, http.StatusNotFound, problemOrderNotFound, "Order not found", "")
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, o)
}

func (c *checkout) problem(w http.ResponseWriter, r *http.Request, status int, slug, title, detail string) {
	c.render(w, r, idem.Problem{
		Type: problemBase + slug, Title: title, Status: status, Detail: detail, Slug: slug,
	})
}

// decodeOrder reads and validates the body of POST /orders. A non-empty
// detail says, for the client, what is wrong.
func decodeOrder(body io.Reader) (createOrderRequest, string) {
	var in createOrderRequest
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil || dec.Decode(&struct{}{}) != io.EOF {
		return in, `The body must be one JSON object like {"hold_ids": [88211, 88212], "payment_method": "pm_card_visa"}.`
	}
	switch {
	case len(in.HoldIDs) == 0:
		return in, "hold_ids must list at least one hold."
	case len(in.HoldIDs) > maxHolds:
		return in, "hold_ids lists more than 50 holds."
	case in.PaymentMethod == "":
		return in, "payment_method is required."
	case !strings.HasPrefix(in.PaymentMethod, "pm_") || len(in.PaymentMethod) > 255:
		return in, `payment_method must be a payment method id starting with "pm_".`
	}
	seen := make(map[int64]bool, len(in.HoldIDs))
	for _, id := range in.HoldIDs {
		if id <= 0 {
			return in, "hold_ids must be positive."
		}
		if seen[id] {
			return in, "hold_ids must not repeat a hold."
		}
		seen[id] = true
	}
	return in, ""
}

// paymentContext returns the context of the call to the provider. It keeps
// the guard's deadline, which in hybrid mode ends before the Redis lease, but
// drops the client's cancellation: once a charge is under way, a client that
// hangs up must not turn it into an unknown outcome. The answer is then
// stored by the guard and replayed to the client's retry.
func paymentContext(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline := time.Now().Add(paymentTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	return context.WithDeadline(context.WithoutCancel(ctx), deadline)
}

// bearerUser is the demo authentication: "Authorization: Bearer <user-id>",
// where the token is the user id itself (1 to 64 characters of letters,
// digits and ._@-). It reports false when the header is missing or invalid.
// It is also the guard's ScopeFunc: keys are unique per user.
func bearerUser(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	if token == "" || len(token) > 64 {
		return "", false
	}
	for i := 0; i < len(token); i++ {
		switch c := token[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			c == '.', c == '_', c == '@', c == '-':
		default:
			return "", false
		}
	}
	return token, true
}
