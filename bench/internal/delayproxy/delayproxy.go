// Package delayproxy puts PostgreSQL at a distance: a TCP proxy that adds a
// fixed round-trip time to every connection, for the crossover sweep
// (`go run ./bench crossover`), where the machine has no netem (the kernel of
// the bench's container has no sch_netem, so `tc qdisc ... netem` fails).
//
// Each direction is a delay line: bytes read at time t are written at
// t + RTT/2, in order, and later bytes do not wait for earlier ones to be
// delivered, so pipelined traffic keeps its pipelining, as on a real link.
//
// It runs in a process of its own (the bench re-runs its binary with the
// delayproxy subcommand, [Start]), so that its CPU is measured apart from
// the bench's and shown in the report: on a real network that work is done
// by switches, not by the machines.
package delayproxy

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"time"
)

// Proxy forwards connections from its listener to a target address, adding
// RTT to each round trip.
type Proxy struct {
	ln     net.Listener
	target string
	half   time.Duration // delay of each direction
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// Listen starts a proxy on addr to target with the given added round-trip
// time (0: a plain forwarder).
func Listen(addr, target string, rtt time.Duration) (*Proxy, error) {
	if rtt < 0 {
		return nil, fmt.Errorf("delayproxy: negative round-trip time %v", rtt)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("delayproxy: %w", err)
	}
	p := &Proxy{ln: ln, target: target, half: rtt / 2, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops listening, closes every connection and waits for the copies
// to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = client.Close()
		return
	}
	for _, c := range []net.Conn{client, server} {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
	}
	if !p.track(client) || !p.track(server) {
		_ = server.Close()
		_ = client.Close()
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() { p.line(server, client) })
	wg.Go(func() { p.line(client, server) })
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, server)
	p.mu.Unlock()
	_ = client.Close()
	_ = server.Close()
}

// chunk is bytes read from one side and the time they may be written to the
// other.
type chunk struct {
	b   []byte
	due time.Time
}

// line copies src to dst, each chunk delayed by half the round trip. When
// either side ends, both are closed.
func (p *Proxy) line(dst, src net.Conn) {
	q := make(chan chunk, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range q {
			if d := time.Until(c.due); d > 0 {
				sleep(d)
			}
			if _, err := dst.Write(c.b); err != nil {
				_ = src.Close()
				for range q { // let the reader finish
				}
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			q <- chunk{b: append([]byte(nil), buf[:n]...), due: time.Now().Add(p.half)}
		}
		if err != nil {
			break
		}
	}
	close(q)
	<-done
	_ = dst.Close()
}

// Process is a proxy running in a child process.
type Process struct {
	cmd   *exec.Cmd
	stdin io.Closer
	addr  string
	done  chan struct{}
}

// Start runs binary (the bench's own executable) with the arguments
// "delayproxy -target target -rtt rtt", at a raised priority when allowed,
// and waits until it listens on a free port of 127.0.0.1. The child exits when its stdin, held by this process,
// closes: on Close, or when this process dies.
func Start(ctx context.Context, binary, target string, rtt time.Duration) (*Process, error) {
	cmd := exec.Command(binary, "delayproxy", "-target", target, "-rtt", rtt.String())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("delayproxy: %w", err)
	}
	p := &Process{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	_ = raisePriority(cmd.Process.Pid) // best effort: see raisePriority
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
				addr <- a
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case p.addr = <-addr:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("delayproxy: exited before listening: %s", stderr.String())
	case <-t.C:
		p.Close()
		return nil, errors.New("delayproxy: did not listen within 10s")
	case <-ctx.Done():
		p.Close()
		return nil, ctx.Err()
	}
}

// Between starts a proxy child (Start) in front of the PostgreSQL server of
// dbURL and returns it with the URL that reaches the server through it.
func Between(ctx context.Context, binary, dbURL string, rtt time.Duration) (*Process, string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return nil, "", fmt.Errorf("delayproxy: database URL: %w", err)
	}
	host := u.Host
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(host, "5432")
	}
	p, err := Start(ctx, binary, host, rtt)
	if err != nil {
		return nil, "", err
	}
	u.Host = p.addr
	return p, u.String(), nil
}

// PID is the child's process id, for its CPU.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Close stops the child and waits for it (killing it after 3s).
func (p *Process) Close() {
	_ = p.stdin.Close()
	select {
	case <-p.done:
	case <-time.After(3 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Command is the child's main function (`bench delayproxy -target ... -rtt
// ...`): it prints "listening <addr>" and serves until stdin closes. It
// returns the exit code.
func Command(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	signal.Ignore(os.Interrupt) // the bench stops its proxies
	fs := flag.NewFlagSet("delayproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		listen = fs.String("listen", "127.0.0.1:0", "listen address")
		target = fs.String("target", "127.0.0.1:5432", "address to forward to")
		rtt    = fs.Duration("rtt", 0, "added round-trip time")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	p, err := Listen(*listen, *target, *rtt)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintf(stdout, "listening %s\n", p.Addr())
	_, _ = io.Copy(io.Discard, stdin)
	_ = p.Close()
	return 0
}
