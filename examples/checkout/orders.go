package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemguard/idem"
)

// Problem type slugs of the checkout's own answers, appended to problemBase.
// (The guard's own refusals use idem's slugs under the same base.)
const (
	problemInvalidOrder   = "invalid-order"       // 400, stored and replayed
	problemCardDeclined   = "card-declined"       // 402, stored and replayed
	problemPaymentTimeout = "payment-timeout"     // 504, not stored: the key stays in progress
	problemOrderNotFound  = "order-not-found"     // 404
	problemNotRecorded    = "order-not-recorded"  // 500, not stored: the key stays in progress
	problemUnavailable    = "service-unavailable" // 503, nothing charged: the key is released
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
	OrderPaymentUnknown OrderStatus = "payment_unknown" // the charge timed out: the reconciler asks the provider
	OrderAbandoned      OrderStatus = "abandoned"       // the reconciler found no charge and released the key: the retry, the intent's next attempt, takes the order up again
)

// Order is a checkout of seat holds. The exported fields are its JSON form.
type Order struct {
	ID       string      `json:"id"`
	Status   OrderStatus `json:"status"`
	HoldIDs  []int64     `json:"hold_ids"`
	ChargeID string      `json:"charge_id,omitempty"`

	owner          string // the user id (the guard's scope)
	idempotencyKey string // the client's key
	paymentMethod  string
	amount         int64
}

// orderID is the public id of the order an intent creates. It is derived from
// the intent's ID (the claim of the Idempotency-Key), so the request and the
// reconciler name the same order, and a key reused after it expired, a new
// intent, creates a new order and a new charge.
func orderID(intent idem.Token) string { return idem.DeriveID("ord_", "order", intent) }

// paymentKey is the idempotency key the order's charge is sent to the
// provider with, derived from the order so that every call about this order,
// including a reconciler's, names the same charge: "order-{public_id}".
func (o *Order) paymentKey() string {
	k, err := idem.DownstreamKey("order", o.ID)
	if err != nil { // an order id is always a valid key part
		panic(err)
	}
	return k
}

// checkout serves the order endpoints.
type checkout struct {
	payrail *Payrail
	orders  *orderStore
	render  func(w http.ResponseWriter, r *http.Request, p idem.Problem)
	log     *slog.Logger
}

// createOrderRequest is the body of POST /orders.
type createOrderRequest struct {
	HoldIDs       []int64 `json:"hold_ids"`
	PaymentMethod string  `json:"payment_method"`
}

// createOrder serves POST /orders behind the idem middleware: whatever it
// answers below 500 is stored and replayed to every retry with the same
// Idempotency-Key; a 5xx leaves the key in progress until the reconciler
// settles it.
//
// The order row is written before the charge, so that the reconciler finds
// every order whose charge may have happened. The final state of the order and
// the stored answer commit in one transaction (idem.Complete): a crash between
// "order paid" and "answer stored" cannot happen.
func (c *checkout) createOrder(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	x := idem.ExecutionFromContext(ctx) // the middleware guards this handler
	req, intent := x.Request, x.Intent
	if x.Attempt == 0 {
		c.problem(w, r, http.StatusInternalServerError, "not-guarded", "Not guarded", "")
		return
	}
	in, detail := decodeOrder(r.Body)
	if detail != "" {
		c.problem(w, r, http.StatusBadRequest, problemInvalidOrder, "Invalid order", detail)
		return
	}
	o, err := c.orders.create(ctx, Order{
		ID:             orderID(intent),
		Status:         OrderPendingPayment,
		HoldIDs:        in.HoldIDs,
		owner:          req.Scope,
		idempotencyKey: req.Key,
		paymentMethod:  in.PaymentMethod,
		amount:         int64(len(in.HoldIDs)) * pricePerHold,
	})
	if err != nil {
		// Nothing was charged: tell the guard that a retry is safe, so the
		// key is released instead of left in progress.
		idem.MarkRetrySafe(ctx)
		c.log.LogAttrs(ctx, slog.LevelError, "checkout: order not created", slog.Any("error", err))
		c.problem(w, r, http.StatusServiceUnavailable, problemUnavailable, "Service unavailable",
			"The order could not be created. Nothing was charged. Retry with the same Idempotency-Key.")
		return
	}

	// The guard already keeps a client's hang-up from cancelling ctx; the
	// work's deadline (in hybrid mode, before the Redis lease ends)
	// still applies, and this bounds the provider call further.
	pctx, cancel := context.WithTimeout(ctx, paymentTimeout)
	defer cancel()
	ch, err := c.payrail.Charge(pctx, o.paymentKey(), ChargeRequest{
		Amount: o.amount, Currency: "EUR", PaymentMethod: o.paymentMethod,
	})
	switch {
	case errors.Is(err, ErrDeclined):
		o.Status = OrderDeclined
		c.finish(w, r, o, declinedResponse())
	case err != nil:
		// The charge may or may not have happened. Answer 5xx so that the
		// guard leaves the key in progress: a retry gets 409 instead of a
		// second order and a second charge, until the reconciler has asked
		// the provider about the order's payment key.
		o.Status = OrderPaymentUnknown
		if uerr := c.orders.update(ctx, c.orders.pool, o); uerr != nil {
			c.log.LogAttrs(ctx, slog.LevelError, "checkout: order status not recorded", slog.Any("error", uerr))
		}
		c.log.LogAttrs(ctx, slog.LevelWarn, "checkout: payment outcome unknown",
			slog.String("order", o.ID), slog.String("payment_key", o.paymentKey()), slog.Any("error", err))
		c.problem(w, r, http.StatusGatewayTimeout, problemPaymentTimeout, "Payment provider timed out",
			"The payment provider did not answer in time; the charge may have been made. Retrying with the same Idempotency-Key is safe: it answers 409 until the outcome is known.")
	default:
		o.Status = OrderPaid
		o.ChargeID = ch.ID
		c.finish(w, r, o, createdResponse(o))
	}
}

// finish records the order's final state and the answer in one transaction,
// then sends the answer. If that transaction fails, the charge has happened
// but nothing says so: answer 500, which leaves the key in progress for the
// reconciler (it finds the charge at the provider and settles the key).
func (c *checkout) finish(w http.ResponseWriter, r *http.Request, o Order, resp idem.Response) {
	ctx := r.Context() // the guard's work context, which the client's hang-up does not end: recorded even if the client left
	err := pgx.BeginFunc(ctx, c.orders.pool, func(tx pgx.Tx) error {
		if err := c.orders.update(ctx, tx, o); err != nil {
			return err
		}
		return idem.Complete(ctx, tx, resp)
	})
	if errors.Is(err, idem.ErrSuperseded) {
		// The key was settled or released while this request ran (it
		// overran the guard's MaxHold): the stored answer, if any, is the
		// answer, and the retry gets it.
		c.problem(w, r, http.StatusConflict, idem.ProblemInProgress, "Request in progress",
			"Another attempt of this request has completed. Retry with the same Idempotency-Key to get its answer.")
		return
	}
	if err != nil {
		c.log.LogAttrs(ctx, slog.LevelError, "checkout: order outcome not recorded; the reconciler will settle it",
			slog.String("order", o.ID), slog.Any("error", err))
		c.problem(w, r, http.StatusInternalServerError, problemNotRecorded, "Order outcome not recorded",
			"The payment was processed but its outcome could not be recorded yet. Retrying with the same Idempotency-Key is safe: it answers 409 until the outcome is known.")
		return
	}
	resp.Write(w)
}

// createdResponse is the answer to a paid order. The reconciler builds the
// same answer for an order it settles.
func createdResponse(o Order) idem.Response {
	body, _ := json.Marshal(o) // plain strings and numbers: cannot fail
	return idem.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Location": {"/orders/" + o.ID}, "Content-Type": {"application/json"}},
		Body:   append(body, '\n'),
	}
}

// declinedResponse is the answer to a declined payment: a problem that is
// stored and replayed like any other answer below 500.
func declinedResponse() idem.Response {
	return problemResponse(http.StatusPaymentRequired, problemCardDeclined, "Card declined",
		"The payment method was declined. Nothing was charged. To pay with another method, send a new request with a new Idempotency-Key.")
}

func problemResponse(status int, slug, title, detail string) idem.Response {
	body, _ := json.Marshal(idem.Problem{Type: problemBase + slug, Title: title, Status: status, Detail: detail})
	return idem.Response{
		Status: status,
		Header: http.Header{"Content-Type": {"application/problem+json"}, "Cache-Control": {"no-store"}},
		Body:   body,
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
	o, ok, err := c.orders.get(r.Context(), r.PathValue("id"))
	if err != nil {
		c.log.LogAttrs(r.Context(), slog.LevelError, "checkout: order not read", slog.Any("error", err))
		c.problem(w, r, http.StatusServiceUnavailable, problemUnavailable, "Service unavailable", "")
		return
	}
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
