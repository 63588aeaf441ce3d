package delayproxy

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// echo starts a TCP echo server and returns its address.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func TestProxyAddsTheRoundTripAndKeepsPipelining(t *testing.T) {
	// Long enough that a loaded machine's scheduling delays (tens of
	// milliseconds) stay well inside the margin below.
	const rtt = 400 * time.Millisecond
	p, err := Listen("127.0.0.1:0", echo(t), rtt)
	require.NoError(t, err)
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()

	// Two messages sent a few milliseconds apart, so that the proxy reads
	// them as two chunks. Each must come back at least one round trip after
	// it was sent, and the second must not wait for the first: a proxy that
	// waited out each chunk's delay before reading the next would deliver
	// it half a round trip later than its own round trip, less the gap.
	sentA := time.Now()
	_, err = c.Write([]byte("a"))
	require.NoError(t, err)
	time.Sleep(5 * time.Millisecond)
	sentB := time.Now()
	_, err = c.Write([]byte("b"))
	require.NoError(t, err)
	buf := make([]byte, 1)
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	gotA := time.Now()
	require.Equal(t, "a", string(buf))
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	gotB := time.Now()
	require.Equal(t, "b", string(buf))

	require.GreaterOrEqual(t, gotA.Sub(sentA), rtt, "the round trip is added")
	require.GreaterOrEqual(t, gotB.Sub(sentB), rtt, "the round trip is added")
	gap := sentB.Sub(sentA)
	serial := sentA.Add(rtt + rtt/2) // when a proxy without pipelining would deliver it
	require.Less(t, gotB.Sub(sentB), rtt+rtt/4,
		"the second message waited for the first (sent %v apart; without pipelining it arrives %v after it was sent)", gap, serial.Sub(sentB))
}

func TestCloseEndsConnections(t *testing.T) {
	p, err := Listen("127.0.0.1:0", echo(t), 0)
	require.NoError(t, err)
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write([]byte("x"))
	require.NoError(t, err)
	buf := make([]byte, 1)
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	require.NoError(t, p.Close())
	_, err = c.Read(buf)
	require.Error(t, err)
}
