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
	const rtt = 40 * time.Millisecond
	p, err := Listen("127.0.0.1:0", echo(t), rtt)
	require.NoError(t, err)
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()

	// Two messages sent 5 ms apart: each comes back one round trip after it
	// was sent. A proxy that waited out each chunk's delay before reading
	// the next would hold the second for a further half round trip.
	start := time.Now()
	_, err = c.Write([]byte("a"))
	require.NoError(t, err)
	time.Sleep(5 * time.Millisecond)
	_, err = c.Write([]byte("b"))
	require.NoError(t, err)
	buf := make([]byte, 1)
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	first := time.Since(start)
	require.Equal(t, "a", string(buf))
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	second := time.Since(start)
	require.Equal(t, "b", string(buf))

	require.GreaterOrEqual(t, first, rtt)
	require.GreaterOrEqual(t, second, rtt+5*time.Millisecond)
	require.Less(t, second-first, rtt/2, "the second message waited for the first")
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
