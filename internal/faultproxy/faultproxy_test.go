package faultproxy_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemguard/idem/internal/faultproxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo starts a line echo server on loopback, closed at cleanup.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

type client struct {
	net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return &client{Conn: c, r: bufio.NewReader(c)}
}

// roundTrip sends a line and reads it back within timeout.
func (c *client) roundTrip(line string, timeout time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		return "", err
	}
	got, err := c.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return got[:len(got)-1], nil
}

func TestPassAndLatency(t *testing.T) {
	p := faultproxy.Start(t, echo(t))
	c := dial(t, p.Addr())
	got, err := c.roundTrip("hello", time.Second)
	require.NoError(t, err)
	require.Equal(t, "hello", got)

	p.SetLatency(50 * time.Millisecond)
	start := time.Now()
	got, err = c.roundTrip("slow", 2*time.Second)
	require.NoError(t, err)
	require.Equal(t, "slow", got)
	require.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond, "latency applies both ways")

	p.SetLatency(0)
	require.Equal(t, faultproxy.Pass, p.Mode())
	require.Equal(t, 1, p.Stats().Accepted)
	require.Equal(t, 1, p.Stats().Open)
}

func TestCutAllResets(t *testing.T) {
	p := faultproxy.Start(t, echo(t))
	c1, c2 := dial(t, p.Addr()), dial(t, p.Addr())
	for _, c := range []*client{c1, c2} {
		_, err := c.roundTrip("x", time.Second)
		require.NoError(t, err)
	}
	require.Equal(t, 2, p.CutAll())
	for _, c := range []*client{c1, c2} {
		_, err := c.roundTrip("y", time.Second)
		require.Error(t, err)
		require.True(t, errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE), "%v", err)
	}
	// New connections still work.
	got, err := dial(t, p.Addr()).roundTrip("z", time.Second)
	require.NoError(t, err)
	require.Equal(t, "z", got)
	require.Equal(t, 2, p.Stats().Cut)
}

func TestStallAndResume(t *testing.T) {
	p := faultproxy.Start(t, echo(t))
	c := dial(t, p.Addr())
	p.Stall()
	_, err := c.roundTrip("held", 150*time.Millisecond)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout(), "a stalled server times the client out")

	// A new connection is accepted but stalled too.
	c2 := dial(t, p.Addr())
	_, err = c2.roundTrip("also held", 100*time.Millisecond)
	require.Error(t, err)

	require.NoError(t, p.Resume())
	// The held bytes arrive once traffic flows again.
	_ = c.SetDeadline(time.Now().Add(time.Second))
	got, err := c.r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "held\n", got)
}

func TestRefuseAndResume(t *testing.T) {
	p := faultproxy.Start(t, echo(t))
	c := dial(t, p.Addr())
	_, err := c.roundTrip("a", time.Second)
	require.NoError(t, err)

	p.Refuse()
	require.Equal(t, faultproxy.Refuse, p.Mode())
	_, err = c.roundTrip("b", time.Second)
	require.Error(t, err, "open connections are reset")
	_, err = net.DialTimeout("tcp", p.Addr(), time.Second)
	require.ErrorIs(t, err, syscall.ECONNREFUSED)

	require.NoError(t, p.Resume())
	got, err := dial(t, p.Addr()).roundTrip("c", time.Second)
	require.NoError(t, err)
	require.Equal(t, "c", got)
}

func TestStalledConnectionCanBeCut(t *testing.T) {
	p := faultproxy.Start(t, echo(t))
	c := dial(t, p.Addr())
	p.Stall()
	_, _ = c.Write([]byte("x\n"))
	require.Eventually(t, func() bool { return p.Stats().Open == 1 }, time.Second, 5*time.Millisecond)
	require.Equal(t, 1, p.CutAll())
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	_, err := c.r.ReadString('\n')
	require.Error(t, err)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "a cut, not a timeout: %v", err)
}

func TestUnreachableTarget(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	require.NoError(t, ln.Close())
	p := faultproxy.Start(t, dead)
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err == nil { // the reset may come before or after connect returns
		defer c.Close()
		_, err = (&client{Conn: c, r: bufio.NewReader(c)}).roundTrip("x", time.Second)
	}
	require.Error(t, err, "the client sees the target's refusal as a reset")
}

func TestCloseIsIdempotent(t *testing.T) {
	p, err := faultproxy.New(echo(t))
	require.NoError(t, err)
	c := dial(t, p.Addr())
	_, err = c.roundTrip("x", time.Second)
	require.NoError(t, err)
	p.Close()
	p.Close()
	require.Error(t, p.Resume())
	require.Equal(t, "pass", faultproxy.Pass.String())
	require.Equal(t, "stall", faultproxy.Stall.String())
}
