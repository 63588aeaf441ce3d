// Package faultproxy is a small TCP proxy for fault-injection tests: it sits
// between a client (a pgx pool, a go-redis client) and a server on loopback,
// and can add latency, reset every open connection, stall traffic, refuse new
// connections, and go back to normal.
//
// Every fault is a mode switch on the running proxy, so a test can inject it
// in the middle of a load and clear it again:
//
//	p := faultproxy.Start(t, "127.0.0.1:6379")
//	client := redis.NewClient(&redis.Options{Addr: p.Addr()})
//	p.SetLatency(200 * time.Millisecond) // slow
//	p.CutAll()                           // connection reset by peer
//	p.Refuse()                           // connection refused
//	p.Resume()                           // healthy again
//
// A Proxy is safe for concurrent use. It only listens on 127.0.0.1.
package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Mode is what the proxy does with traffic.
type Mode int

const (
	// Pass forwards bytes both ways (after the configured latency).
	Pass Mode = iota
	// Stall keeps connections open and accepts new ones, but forwards
	// nothing until the mode changes: a server that stopped answering.
	Stall
	// Refuse closes the listening socket, so new connections get ECONNREFUSED,
	// and resets every open connection: a server that is down.
	Refuse
)

func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Stall:
		return "stall"
	case Refuse:
		return "refuse"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// Stats counts what the proxy did since it started.
type Stats struct {
	Accepted int // connections accepted
	Cut      int // connections reset by CutAll, Refuse or Close
	Open     int // connections open now
}

// Proxy forwards TCP connections from Addr to a target address.
type Proxy struct {
	target string
	addr   string

	mu      sync.Mutex
	ln      net.Listener
	mode    Mode
	latency time.Duration
	resumed chan struct{} // closed and replaced when the mode leaves Stall
	conns   map[*pair]struct{}
	stats   Stats
	closed  bool
	wg      sync.WaitGroup
}

// pair is one proxied connection: client side and server side.
type pair struct {
	client, server net.Conn
	once           sync.Once
	dead           chan struct{} // closed by reset
}

func newPair(c net.Conn) *pair { return &pair{client: c, dead: make(chan struct{})} }

// reset closes both sides with SO_LINGER 0, so that each peer sees a TCP RST
// ("connection reset by peer") rather than an orderly EOF.
func (p *pair) reset() {
	p.once.Do(func() {
		close(p.dead)
		for _, c := range []net.Conn{p.client, p.server} {
			if c == nil {
				continue
			}
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			_ = c.Close()
		}
	})
}

// New starts a proxy to target on a free port of 127.0.0.1. Close it when
// done.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{
		target:  target,
		addr:    ln.Addr().String(),
		ln:      ln,
		resumed: make(chan struct{}),
		conns:   map[*pair]struct{}{},
	}
	p.wg.Add(1)
	go p.accept(ln)
	return p, nil
}

// Start is New for tests: it fails tb on error and closes the proxy when tb
// ends.
func Start(tb testing.TB, target string) *Proxy {
	tb.Helper()
	p, err := New(target)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return p
}

// Addr returns the proxy's address (host:port); clients connect there. It
// does not change across Refuse and Resume.
func (p *Proxy) Addr() string { return p.addr }

// Target returns the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Mode returns the current mode.
func (p *Proxy) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Stats returns a snapshot of the counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Open = len(p.conns)
	return s
}

// SetLatency delays every chunk of bytes forwarded, in both directions, by d.
// Zero removes the delay. It applies to open and new connections.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
}

// CutAll resets every open connection (both peers see a TCP RST). New
// connections are accepted as the mode says.
func (p *Proxy) CutAll() int {
	p.mu.Lock()
	victims := make([]*pair, 0, len(p.conns))
	for c := range p.conns {
		victims = append(victims, c)
		delete(p.conns, c)
	}
	p.stats.Cut += len(victims)
	p.mu.Unlock()
	for _, c := range victims {
		c.reset()
	}
	return len(victims)
}

// Stall stops forwarding: open and new connections stay open but nothing
// passes until Resume (or Refuse, CutAll, Close).
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = Stall
}

// Refuse makes the proxy look like a server that is down: it stops listening
// (new connections are refused by the kernel) and resets every open
// connection.
func (p *Proxy) Refuse() {
	p.mu.Lock()
	p.setPassingLocked() // wake stalled copies: their connections are cut below
	p.mode = Refuse
	ln := p.ln
	p.ln = nil
	p.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	p.CutAll()
}

// Resume goes back to Pass: stalled bytes flow again and, after Refuse, the
// proxy listens again on the same address. Latency is kept; set it to zero
// with SetLatency.
func (p *Proxy) Resume() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("faultproxy: closed")
	}
	p.setPassingLocked()
	p.mode = Pass
	if p.ln != nil {
		return nil
	}
	// The port was ours a moment ago; on loopback nobody else takes it, but
	// give the kernel a few tries.
	var err error
	for range 50 {
		var ln net.Listener
		ln, err = net.Listen("tcp", p.addr)
		if err == nil {
			p.ln = ln
			p.wg.Add(1)
			go p.accept(ln)
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("faultproxy: listen again on %s: %w", p.addr, err)
}

// setPassingLocked releases stalled copies. p.mu must be held.
func (p *Proxy) setPassingLocked() {
	if p.mode == Stall {
		close(p.resumed)
		p.resumed = make(chan struct{})
	}
}

// Close stops listening, resets every connection and waits for the proxy's
// goroutines to end. It is idempotent.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.setPassingLocked()
	p.mode = Refuse
	ln := p.ln
	p.ln = nil
	p.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	p.CutAll()
	p.wg.Wait()
}

func (p *Proxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return // closed by Refuse or Close
		}
		p.mu.Lock()
		if p.closed || p.mode == Refuse {
			p.mu.Unlock()
			newPair(c).reset()
			continue
		}
		p.stats.Accepted++
		pr := newPair(c)
		p.conns[pr] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(pr)
	}
}

func (p *Proxy) serve(pr *pair) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	p.mu.Lock()
	_, live := p.conns[pr]
	if err != nil || !live {
		delete(p.conns, pr)
		p.mu.Unlock()
		if server != nil {
			_ = server.Close()
		}
		pr.reset()
		return
	}
	pr.server = server
	p.mu.Unlock()

	done := make(chan struct{}, 2)
	go func() { p.copy(pr, pr.server, pr.client); done <- struct{}{} }()
	go func() { p.copy(pr, pr.client, pr.server); done <- struct{}{} }()
	<-done
	// One direction ended (EOF, reset or close): end the other one too.
	p.mu.Lock()
	delete(p.conns, pr)
	p.mu.Unlock()
	pr.reset()
	<-done
}

// copy forwards src to dst chunk by chunk, honouring latency and stalls.
func (p *Proxy) copy(pr *pair, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.gate(pr) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			// Half-close: pass the EOF on, keep the other direction.
			if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			return
		}
	}
}

// gate waits out the latency and any stall before a chunk is forwarded. It
// reports false when the connection was reset or the proxy refuses or has
// closed.
func (p *Proxy) gate(pr *pair) bool {
	for {
		p.mu.Lock()
		mode, lat, resumed, closed := p.mode, p.latency, p.resumed, p.closed
		p.mu.Unlock()
		switch {
		case closed || mode == Refuse:
			return false
		case mode == Stall:
			select {
			case <-resumed:
				continue
			case <-pr.dead:
				return false
			}
		}
		if lat > 0 {
			t := time.NewTimer(lat)
			select {
			case <-t.C:
			case <-pr.dead:
				t.Stop()
				return false
			}
		}
		return true
	}
}
