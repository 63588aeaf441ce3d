package main

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/idemclient"
)

// dropFirstAnswer is a TCP proxy to target on loopback. On its first
// connection it forwards the request, waits for the first byte of the
// answer (the middleware sends only what it has stored) and closes both
// sides instead of passing it on; later connections pass through. It
// returns the proxy's address; it stops, with every connection, when t ends.
func dropFirstAnswer(t *testing.T, target string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	var conns atomic.Int32
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			first := conns.Add(1) == 1
			wg.Go(func() {
				defer c.Close()
				s, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer s.Close()
				wg.Go(func() {
					_, _ = io.Copy(s, c) // the requests; ends when the client closes
					_ = s.Close()
				})
				if first {
					_, _ = s.Read(make([]byte, 1)) // the answer is stored: it is being sent
					_ = c.Close()
					return
				}
				_, _ = io.Copy(c, s)
			})
		}
	})
	return ln.Addr().String()
}

// The checkout's answer is lost on the way back, after the order was paid
// and its answer stored: idemclient retries with the same key and body and
// gets that answer, replayed; the provider charged once.
func TestClientRetryAfterALostAnswer(t *testing.T) {
	forEachStrategy(t, func(t *testing.T, a *app) {
		proxy := dropFirstAnswer(t, strings.TrimPrefix(a.base, "http://"))
		base := &http.Transport{}
		t.Cleanup(base.CloseIdleConnections)
		client := &http.Client{Timeout: 20 * time.Second, Transport: idemclient.New(base,
			&idemclient.Config{Retry: idemclient.Retry{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}})}

		user := newUser()
		req, err := http.NewRequest(http.MethodPost, "http://"+proxy+"/orders", strings.NewReader(orderBody("pm_card_visa", 88211)))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+user)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusCreated, resp.StatusCode, "body: %s", body)

		res := idemclient.ResultOf(resp)
		require.True(t, res.Replayed, "the retry gets the stored answer")
		require.Equal(t, 2, res.Attempts)
		o := decodeOrderReply(t, reply{Status: resp.StatusCode, Header: resp.Header, Body: body})
		require.Equal(t, "paid", o.Status)
		require.Equal(t, 1, a.charges(t), "one charge")

		again := a.postOrder(t, user, res.Key, orderBody("pm_card_visa", 88211))
		require.True(t, again.replayed())
		require.Equal(t, body, again.Body, "the key the client drew holds that order")
	})
}
