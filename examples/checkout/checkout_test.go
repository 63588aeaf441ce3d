package main

import (
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/internal/testdb"
)

func TestCreateAndReplay(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, a *app) {
		user, key := newUser(), newKey()
		body := orderBody("pm_card_visa", 88211, 88212)

		first := a.postOrder(t, user, key, body)
		require.Equal(t, http.StatusCreated, first.Status, "body: %s", first.Body)
		require.False(t, first.replayed())
		require.Equal(t, "application/json", first.Header.Get("Content-Type"))
		o := decodeOrderReply(t, first)
		require.Regexp(t, `^ord_[a-z2-7]{26}$`, o.ID)
		require.Equal(t, "paid", o.Status)
		require.Equal(t, []int64{88211, 88212}, o.HoldIDs)
		require.Regexp(t, `^ch_[a-z2-7]{20}$`, o.ChargeID)
		require.Equal(t, "/orders/"+o.ID, first.Header.Get("Location"))
		require.Equal(t, 1, a.charges(t))

		retry := a.postOrder(t, user, key, body)
		require.Equal(t, http.StatusCreated, retry.Status)
		require.True(t, retry.replayed())
		require.Equal(t, first.Body, retry.Body, "a replay is byte-identical")
		require.Equal(t, first.Header.Get("Location"), retry.Header.Get("Location"))
		require.Equal(t, "application/json", retry.Header.Get("Content-Type"))
		require.Equal(t, 1, a.charges(t), "a replay charges nothing")

		got := a.do(t, http.MethodGet, "/orders/"+o.ID, user, "", "")
		require.Equal(t, http.StatusOK, got.Status)
		require.Equal(t, o, decodeOrderReply(t, got))
		other := a.do(t, http.MethodGet, "/orders/"+o.ID, newUser(), "", "")
		require.Equal(t, http.StatusNotFound, other.Status, "only the owner sees an order")
		require.Equal(t, problemBase+"order-not-found", other.problemType(t))
		anon := a.do(t, http.MethodGet, "/orders/"+o.ID, "", "", "")
		require.Equal(t, http.StatusUnauthorized, anon.Status)
	})
}

func TestConcurrentRetries(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, a *app) {
		const n = 64
		user, key := newUser(), newKey()
		body := orderBody("pm_card_visa", 88211)

		replies := make([]reply, n)
		errs := make([]error, n)
		startLine := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-startLine
				replies[i], errs[i] = a.call(http.MethodPost, "/orders", user, key, body)
			})
		}
		close(startLine)
		wg.Wait()

		var original []byte
		var executed, replayed, inProgress, refused int
		for i, r := range replies {
			require.NoError(t, errs[i])
			switch {
			case r.Status == http.StatusCreated && !r.replayed():
				executed++
				original = r.Body
			case r.Status == http.StatusCreated:
				replayed++
			case r.Status == http.StatusConflict:
				inProgress++
				require.Contains(t, []string{"1", "2"}, r.Header.Get("Retry-After"), "1s and its jitter")
				require.Equal(t, problemBase+"request-in-progress", r.problemType(t))
			case r.Status == http.StatusServiceUnavailable:
				// No connection free in time (64 requests, 8 connections):
				// refused before anything ran, as overload must be.
				refused++
				require.Equal(t, problemBase+"service-unavailable", r.problemType(t))
			default:
				t.Fatalf("unexpected answer %d: %s", r.Status, r.Body)
			}
		}
		t.Logf("%d executed, %d replayed, %d in progress, %d refused at admission", executed, replayed, inProgress, refused)
		require.Equal(t, 1, executed, "exactly one request runs")
		require.Equal(t, n, executed+replayed+inProgress+refused)
		for _, r := range replies {
			if r.Status == http.StatusCreated {
				require.Equal(t, original, r.Body)
			}
		}
		require.Equal(t, 1, a.charges(t), "exactly one charge")

		last := a.postOrder(t, user, key, body)
		require.Equal(t, http.StatusCreated, last.Status)
		require.True(t, last.replayed())
		require.Equal(t, original, last.Body)
		require.Equal(t, 1, a.charges(t))
	})
}

func TestKeyReusedWithAnotherBody(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, a *app) {
		user, key := newUser(), newKey()
		first := a.postOrder(t, user, key, orderBody("pm_card_visa", 88211))
		require.Equal(t, http.StatusCreated, first.Status)

		other := a.postOrder(t, user, key, orderBody("pm_card_visa", 88211, 88212))
		require.Equal(t, http.StatusUnprocessableEntity, other.Status)
		require.Equal(t, problemBase+"idempotency-key-reused", other.problemType(t))
		require.Equal(t, "no-store", other.Header.Get("Cache-Control"))
		require.NotContains(t, string(other.Body), decodeOrderReply(t, first).ID, "the stored answer is not revealed")
		require.Equal(t, 1, a.charges(t))
	})
}

func TestSameKeyOtherUser(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, a *app) {
		key, body := newKey(), orderBody("pm_card_visa", 88211)
		alice := a.postOrder(t, newUser(), key, body)
		bob := a.postOrder(t, newUser(), key, body)
		require.Equal(t, http.StatusCreated, alice.Status)
		require.Equal(t, http.StatusCreated, bob.Status, "keys are per user")
		require.False(t, bob.replayed())
		require.NotEqual(t, decodeOrderReply(t, alice).ID, decodeOrderReply(t, bob).ID)
		require.Equal(t, 2, a.charges(t))
	})
}

func TestDeclined(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, a *app) {
		user, key, body := newUser(), newKey(), orderBody(PMDeclined, 88211)
		first := a.postOrder(t, user, key, body)
		require.Equal(t, http.StatusPaymentRequired, first.Status)
		require.Equal(t, problemBase+"card-declined", first.problemType(t))
		require.False(t, first.replayed())

		retry := a.postOrder(t, user, key, body)
		require.Equal(t, http.StatusPaymentRequired, retry.Status, "a decline is an answer: stored and replayed")
		require.True(t, retry.replayed())
		require.Equal(t, first.Body, retry.Body)
		require.Equal(t, "application/problem+json", retry.Header.Get("Content-Type"))
		require.Equal(t, "no-store", retry.Header.Get("Cache-Control"))
		require.Equal(t, 0, a.charges(t), "a decline charges nothing")
	})
}

// TestPaymentTimeout lives through the README's walkthrough "A payment that
// times out", with every duration scaled down by the command's own flags:
// the guard's MaxHold is 5s (46.5s with the defaults), the lease's TTL 3s
// (30s), the reconciler's -reconcile-after 6s (1m) and -reconcile-every 1s
// (10s). Nothing is aged by hand: the lease expires in Redis, the key turns
// pending when its hold passes on the database's clock, and the reconciler
// settles it on its own.
func TestPaymentTimeout(t *testing.T) {
	const (
		maxHold = 5 * time.Second // -work-timeout 1s + 1s + 5 × -store-timeout 500ms + 0.5s
		minAge  = 6 * time.Second
		every   = time.Second
	)
	forEachStrategy(t, func(t *testing.T, a *app) {
		user, key, body := newUser(), newKey(), orderBody(PMTimeout, 88211)
		begun := time.Now()
		order := func() reply { return a.postOrder(t, user, key, body) }

		// order: 504 payment-timeout (the provider charged).
		first := order()
		require.Equal(t, http.StatusGatewayTimeout, first.Status)
		require.Equal(t, problemBase+"payment-timeout", first.problemType(t))
		require.Equal(t, 1, a.charges(t), "the provider charged; only its answer was lost")

		// order: 409 request-in-progress, Retry-After 1 or 2.
		retry := order()
		require.Equal(t, http.StatusConflict, retry.Status, "a 5xx is not stored: the key stays in progress")
		require.Equal(t, problemBase+"request-in-progress", retry.problemType(t))
		require.Contains(t, []string{"1", "2"}, retry.Header.Get("Retry-After"), "1s and its jitter")

		// sleep past MaxHold (the README's 50 s); order: 409
		// request-pending, Retry-After -reconcile-after − MaxHold +
		// -reconcile-every (2s) plus up to a fifth, rounded up.
		time.Sleep(time.Until(begun.Add(maxHold + time.Second)))
		pending := order()
		require.Equal(t, http.StatusConflict, pending.Status, "body: %s", pending.Body)
		require.Equal(t, problemBase+"request-pending", pending.problemType(t))
		require.Contains(t, []string{"2", "3"}, pending.Header.Get("Retry-After"))

		// A client that obeys Retry-After is told pending until the
		// reconciler has settled the key (about twice -reconcile-after
		// after the claim), then gets the 201, replayed.
		settled := pending
		for settled.Status == http.StatusConflict {
			require.Equal(t, problemBase+"request-pending", settled.problemType(t), "past MaxHold the key is pending")
			wait, err := strconv.Atoi(settled.Header.Get("Retry-After"))
			require.NoError(t, err)
			require.Less(t, time.Since(begun), 2*minAge+every+30*time.Second, "the reconciler settles the key")
			time.Sleep(time.Duration(wait) * time.Second)
			settled = order()
		}
		require.Equal(t, http.StatusCreated, settled.Status, "body: %s", settled.Body)
		require.True(t, settled.replayed())
		o := decodeOrderReply(t, settled)
		require.Equal(t, "paid", o.Status)
		require.Equal(t, "/orders/"+o.ID, settled.Header.Get("Location"))
		got := a.do(t, http.MethodGet, "/orders/"+o.ID, user, "", "")
		require.Equal(t, "paid", decodeOrderReply(t, got).Status)
		require.Equal(t, 1, a.charges(t), "one charge, whatever the retries")
		t.Logf("settled and replayed %v after the first request", time.Since(begun).Round(100*time.Millisecond))
	}, "-work-timeout", "1s", "-store-timeout", "500ms", "-lease-ttl", "3s",
		"-reconcile-after", minAge.String(), "-reconcile-every", every.String())
}

func TestInvalidOrder(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, a *app) {
		for name, body := range map[string]string{
			"bad JSON":               `{"hold_ids": [88211`,
			"empty hold_ids":         `{"hold_ids": [], "payment_method": "pm_card_visa"}`,
			"missing payment_method": `{"hold_ids": [88211]}`,
			"unknown field":          `{"hold_ids": [88211], "payment_method": "pm_card_visa", "amount": 1}`,
			"negative hold":          `{"hold_ids": [-1], "payment_method": "pm_card_visa"}`,
			"not a payment method":   `{"hold_ids": [88211], "payment_method": "visa"}`,
		} {
			t.Run(name, func(t *testing.T) {
				user, key := newUser(), newKey()
				first := a.postOrder(t, user, key, body)
				require.Equal(t, http.StatusBadRequest, first.Status)
				require.Equal(t, problemBase+"invalid-order", first.problemType(t))

				retry := a.postOrder(t, user, key, body)
				require.Equal(t, http.StatusBadRequest, retry.Status)
				require.True(t, retry.replayed(), "a 400 is an answer: stored and replayed")
				require.Equal(t, first.Body, retry.Body)
			})
		}
		require.Equal(t, 0, a.charges(t))
	})
}

func TestRefusals(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, a *app) {
		body := orderBody("pm_card_visa", 88211)
		for name, auth := range map[string]string{
			"no header":    "",
			"empty bearer": "Bearer ",
			"basic":        "Basic dXNlcjpwYXNz",
			"bad user id":  "Bearer a/b",
		} {
			t.Run("unauthenticated/"+name, func(t *testing.T) {
				req, err := http.NewRequest(http.MethodPost, a.base+"/orders", strings.NewReader(body))
				require.NoError(t, err)
				if auth != "" {
					req.Header.Set("Authorization", auth)
				}
				req.Header.Set("Idempotency-Key", newKey())
				resp, err := a.client.Do(req)
				require.NoError(t, err)
				defer resp.Body.Close()
				require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
				require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
				require.Equal(t, `Bearer realm="checkout"`, resp.Header.Get("WWW-Authenticate"))
			})
		}
		t.Run("missing key", func(t *testing.T) {
			r := a.postOrder(t, newUser(), "", body)
			require.Equal(t, http.StatusBadRequest, r.Status)
			require.Equal(t, problemBase+"idempotency-key-missing", r.problemType(t))
		})
		t.Run("invalid key", func(t *testing.T) {
			r := a.postOrder(t, newUser(), "a, b", body)
			require.Equal(t, http.StatusBadRequest, r.Status)
			require.Equal(t, problemBase+"idempotency-key-invalid", r.problemType(t))
		})
		require.Equal(t, 0, a.charges(t), "no refused request charged")
	})
}

// With Redis down, the hybrid strategy falls back to the PostgreSQL claim for
// each request: still exactly once.
func TestHybridWithoutRedis(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadAddr := ln.Addr().String()
	require.NoError(t, ln.Close())

	a := start(t, "-strategy", "hybrid", "-redis-addr", deadAddr)
	user, key, body := newUser(), newKey(), orderBody("pm_card_visa", 88211)
	first := a.postOrder(t, user, key, body)
	require.Equal(t, http.StatusCreated, first.Status, "body: %s", first.Body)
	retry := a.postOrder(t, user, key, body)
	require.Equal(t, http.StatusCreated, retry.Status)
	require.True(t, retry.replayed())
	require.Equal(t, first.Body, retry.Body)
	require.Equal(t, 1, a.charges(t))
	require.Contains(t, a.log.String(), "falling back to the table claim")
}

// The start-up log names strategy, database and Redis, never the password.
func TestStartupLog(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testDatabaseURL(t))
	require.NoError(t, err)
	if u.User == nil {
		u.User = url.User("postgres")
	}
	if _, set := u.User.Password(); set {
		t.Skip("TEST_DATABASE_URL has a password of its own")
	}
	u.User = url.UserPassword(u.User.Username(), "s3cret-pw") // ignored under trust auth
	schema := testdb.Schema(t, testdb.Pool(t))

	a := startRaw(t, "-addr", "127.0.0.1:0", "-database-url", u.String(), "-schema", schema)
	log := a.log.String()
	require.Contains(t, log, "strategy=hybrid")
	require.Contains(t, log, "redis=\"embedded miniredis at ")
	require.Contains(t, log, "db=postgres://")
	require.NotContains(t, log, "s3cret-pw")
}
