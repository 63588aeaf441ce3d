package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
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

// Payrail is a fake payment provider that lives in the process. Like a real
// one (Stripe, Adyen) it is idempotent on the key its caller sends: the first
// call with a key decides the outcome, every later call with that key gets
// the same outcome and never charges again. It counts the charges it performs,
// so that a test or a curious human can check that a guarded endpoint charged
// exactly once.
//
// Every Charge call takes the configured latency. If the caller's context ends
// before that, the call fails with the context's error and the fake performs
// nothing (a simplification: a real provider might have acted anyway).
//
// The zero value is not usable; call NewPayrail. A Payrail is safe for
// concurrent use.
type Payrail struct {
	latency time.Duration

	mu      sync.Mutex
	byKey   map[string]Charge // every decided attempt, succeeded or declined
	charges int               // succeeded charges performed
}

// NewPayrail returns a provider whose calls each take latency.
func NewPayrail(latency time.Duration) *Payrail {
	return &Payrail{latency: latency, byKey: map[string]Charge{}}
}

// Charge charges req under the idempotency key key, at most once per key.
//
// The first call with a key succeeds (and counts one charge), or returns
// ErrDeclined for PMDeclined (no charge), or, for PMTimeout, charges and then
// returns ErrTimeout. A later call with the same key and parameters returns
// the first call's charge (or ErrDeclined again) without charging; with other
// parameters it returns ErrKeyReused.
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

	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.byKey[key]; ok {
		if c.Amount != req.Amount || c.Currency != req.Currency || c.PaymentMethod != req.PaymentMethod {
			return Charge{}, ErrKeyReused
		}
		if c.Status == ChargeDeclined {
			return Charge{}, ErrDeclined
		}
		return c, nil
	}
	c := Charge{
		ID:            newID("ch_"),
		Key:           key,
		Amount:        req.Amount,
		Currency:      req.Currency,
		PaymentMethod: req.PaymentMethod,
		Status:        ChargeSucceeded,
		CreatedAt:     time.Now().UTC(),
	}
	if req.PaymentMethod == PMDeclined {
		c.Status = ChargeDeclined
		p.byKey[key] = c
		return Charge{}, ErrDeclined
	}
	p.byKey[key] = c
	p.charges++
	if req.PaymentMethod == PMTimeout {
		return Charge{}, ErrTimeout
	}
	return c, nil
}

// Lookup returns the charge attempt made under key, succeeded or declined,
// and whether there was one. It is what a reconciler asks after a timeout.
func (p *Payrail) Lookup(key string) (Charge, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.byKey[key]
	return c, ok
}

// Count returns the number of charges performed so far (declines excluded).
func (p *Payrail) Count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.charges
}

// serveCount answers GET /payrail/charges with {"count": N}.
func (p *Payrail) serveCount(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, struct {
		Count int `json:"count"`
	}{p.Count()})
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
