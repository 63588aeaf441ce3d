package lock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/internal/testredis"
)

// gate is a go-redis hook that holds the first exchange it sees, a plain
// command or a pipeline, until released, so that a test can queue commands
// behind an exchange in flight, and records the size of every pipeline sent.
type gate struct {
	held    chan struct{} // closed when the first command is held
	release chan struct{}
	once    sync.Once

	mu    sync.Mutex
	sizes []int
}

func newGate() *gate { return &gate{held: make(chan struct{}), release: make(chan struct{})} }

func (g *gate) DialHook(next redis.DialHook) redis.DialHook { return next }

// hold holds the first exchange until released.
func (g *gate) hold() {
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.held)
		<-g.release
	}
}

func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		g.hold()
		return next(ctx, cmd)
	}
}

func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		g.hold()
		g.mu.Lock()
		g.sizes = append(g.sizes, len(cmds))
		g.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (g *gate) pipelines() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int(nil), g.sizes...)
}

// queued reports how many commands wait behind the exchange in flight.
func (p *pipeline) queued() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pending)
}

type pipelineBackend struct {
	name   string
	client func(t *testing.T) (*redis.Client, func(t *testing.T))
}

// pipelineBackends are the real Redis and miniredis; flush empties the
// server's script cache.
var pipelineBackends = []pipelineBackend{
	{"redis", func(t *testing.T) (*redis.Client, func(t *testing.T)) {
		c := testredis.Client(t)
		return c, func(t *testing.T) { require.NoError(t, c.ScriptFlush(context.Background()).Err()) }
	}},
	{"miniredis", func(t *testing.T) (*redis.Client, func(t *testing.T)) {
		mr := miniredis.RunT(t)
		c := testredis.Miniredis(t, mr)
		return c, func(t *testing.T) { require.NoError(t, c.ScriptFlush(context.Background()).Err()) }
	}},
}

// Commands that arrive while an exchange is out go together as one pipeline
// once it returns, each caller gets its own command's reply, an obtain's two
// commands stay together, and a script Redis lost meanwhile (SCRIPT FLUSH) is
// loaded again.
func TestPipelineGroupsQueuedCommands(t *testing.T) {
	for _, b := range pipelineBackends {
		t.Run(b.name, func(t *testing.T) {
			c, flushScripts := b.client(t)
			l, err := New(c, &Config{Prefix: testredis.Prefix(t, c), Timeout: 5 * time.Second})
			require.NoError(t, err)
			ctx := context.Background()

			// Leases to replace once the scripts are gone, taken before
			// the gate is in place.
			const n = 16
			var held []*Lease
			for i := range n {
				lease, _, err := l.Obtain(ctx, "u", fmt.Sprint("r", i), []byte("before"))
				require.NoError(t, err)
				held = append(held, lease)
			}
			g := newGate()
			c.AddHook(g)

			first := make(chan error, 1)
			go func() {
				_, _, err := l.Obtain(ctx, "u", "first", []byte("s-first"))
				first <- err
			}()
			<-g.held

			type result struct {
				i     int
				lease *Lease
				err   error
			}
			obtained := make(chan result, n)
			replaced := make(chan result, n)
			for i := range n {
				go func() {
					lease, _, err := l.Obtain(ctx, "u", fmt.Sprint("k", i), []byte(fmt.Sprint("s", i)))
					obtained <- result{i, lease, err}
				}()
				go func() {
					replaced <- result{i, nil, held[i].Replace(ctx, []byte(fmt.Sprint("after", i)), 0)}
				}()
			}
			require.Eventually(t, func() bool { return l.pipe.queued() == 2*n }, 10*time.Second, time.Millisecond)
			flushScripts(t)
			close(g.release)

			require.NoError(t, <-first)
			for range n {
				r := <-obtained
				require.NoError(t, r.err, "obtain %d", r.i)
				require.NotNil(t, r.lease, "obtain %d", r.i)
				r = <-replaced
				require.NoError(t, r.err, "replace %d", r.i)
			}
			require.Contains(t, g.pipelines(), 3*n, "the queued calls went as one pipeline: two commands per obtain, one per replace")

			// Each key holds its own caller's state.
			for i := range n {
				_, state, err := l.Obtain(ctx, "u", fmt.Sprint("k", i), nil)
				require.ErrorIs(t, err, ErrNotObtained)
				require.Equal(t, fmt.Sprint("s", i), string(state))
				_, state, err = l.Obtain(ctx, "u", fmt.Sprint("r", i), nil)
				require.ErrorIs(t, err, ErrNotObtained)
				require.Equal(t, fmt.Sprint("after", i), string(state))
			}
		})
	}
}

// A caller whose context ends while its command waits gets its context's
// error at once, and its command is never sent.
func TestPipelineCallerGoneIsNotSent(t *testing.T) {
	mr := miniredis.RunT(t)
	c := testredis.Miniredis(t, mr)
	g := newGate()
	c.AddHook(g)
	l, err := New(c, &Config{Timeout: 5 * time.Second})
	require.NoError(t, err)
	ctx := context.Background()

	first := make(chan error, 1)
	go func() {
		_, _, err := l.Obtain(ctx, "u", "first", []byte("x"))
		first <- err
	}()
	<-g.held

	gone, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, _, err := l.Obtain(gone, "u", "gone", []byte("x"))
		errc <- err
	}()
	require.Eventually(t, func() bool { return l.pipe.queued() == 1 }, 10*time.Second, time.Millisecond)
	cancel()
	err = <-errc
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, ErrUnavailable, "the caller gave up; Redis was not at fault")

	close(g.release)
	require.NoError(t, <-first)
	waitIdle(t, l)
	require.True(t, mr.Exists(l.Key("u", "first")))
	require.False(t, mr.Exists(l.Key("u", "gone")), "the gone caller's obtain was not sent")
}

// waitIdle waits until l's pipeline has nothing out and nothing queued.
func waitIdle(t *testing.T, l *Locker) {
	t.Helper()
	require.Eventually(t, func() bool {
		l.pipe.mu.Lock()
		defer l.pipe.mu.Unlock()
		return !l.pipe.busy
	}, 10*time.Second, time.Millisecond)
}

// Set does not wait: its write goes with the next exchange, before every
// command queued after it, so that the caller's next command (and anyone's
// after that) finds it; its callback learns how it went.
func TestPipelineSetGoesBeforeLaterCommands(t *testing.T) {
	for _, b := range pipelineBackends {
		t.Run(b.name, func(t *testing.T) {
			c, _ := b.client(t)
			g := newGate()
			c.AddHook(g)
			l, err := New(c, &Config{Prefix: testredis.Prefix(t, c), Timeout: 5 * time.Second})
			require.NoError(t, err)
			ctx := context.Background()

			first := make(chan error, 1)
			go func() { first <- l.Delete(ctx, "u", "held") }()
			<-g.held

			answered := make(chan error, 1)
			l.Set("u", "k", []byte("copy"), time.Minute, func(err error) { answered <- err })
			require.Equal(t, 1, l.pipe.queued(), "Set returned without waiting for the exchange out")
			type result struct {
				state []byte
				err   error
			}
			obtained := make(chan result, 1)
			go func() {
				_, state, err := l.Obtain(ctx, "u", "k", []byte("claiming"))
				obtained <- result{state, err}
			}()
			require.Eventually(t, func() bool { return l.pipe.queued() == 2 }, 10*time.Second, time.Millisecond)
			close(g.release)

			require.NoError(t, <-first)
			require.NoError(t, <-answered)
			r := <-obtained
			require.ErrorIs(t, r.err, ErrNotObtained, "the obtain queued after Set found its write")
			require.Equal(t, []byte("copy"), r.state)
		})
	}
}

// A write whose exchange fails reports ErrUnavailable to its callback, and a
// write still queued when its ttl has run out is dropped, not written late.
func TestPipelineSetFailsOrExpires(t *testing.T) {
	mr := miniredis.RunT(t)
	c := testredis.Miniredis(t, mr)
	l, err := New(c, &Config{Timeout: 5 * time.Second})
	require.NoError(t, err)

	mr.SetError("LOADING Redis is loading the dataset in memory")
	answered := make(chan error, 1)
	l.Set("u", "k", []byte("copy"), time.Minute, func(err error) { answered <- err })
	require.ErrorIs(t, <-answered, ErrUnavailable)
	mr.SetError("")

	g := newGate()
	c.AddHook(g)
	ctx := context.Background()
	first := make(chan error, 1)
	go func() { first <- l.Delete(ctx, "u", "held") }()
	<-g.held
	l.Set("u", "late", []byte("copy"), 2*time.Millisecond, func(err error) { answered <- err })
	deadline := time.Now().Add(3 * time.Millisecond)
	for time.Now().Before(deadline) { // until the write's ttl has run out, not a guess
		time.Sleep(time.Millisecond)
	}
	close(g.release)
	require.NoError(t, <-first)
	require.NoError(t, <-answered, "a dropped write is not a failure")
	waitIdle(t, l)
	require.False(t, mr.Exists(l.Key("u", "late")), "a write past its ttl is not sent")

	require.Error(t, setAndWait(l, "u", "k", nil, 0), "a ttl below 1ms is refused")
}

// A write queued behind exchanges that outlast the Locker's Timeout is
// dropped and reported unavailable, as a caller that waited would have been:
// during a Redis stall, unwaited writes do not pile up.
func TestPipelineSetGivesUpAfterTimeout(t *testing.T) {
	mr := miniredis.RunT(t)
	c := testredis.Miniredis(t, mr)
	const timeout = 20 * time.Millisecond
	l, err := New(c, &Config{Timeout: timeout})
	require.NoError(t, err)
	g := newGate()
	c.AddHook(g)

	stalled := make(chan error, 1)
	go func() { stalled <- l.Delete(context.Background(), "u", "stalled") }()
	<-g.held
	answered := make(chan error, 1)
	l.Set("u", "k", []byte("copy"), time.Minute, func(err error) { answered <- err })
	deadline := time.Now().Add(timeout + time.Millisecond)
	for time.Now().Before(deadline) { // until the write has waited its Timeout, not a guess
		time.Sleep(time.Millisecond)
	}
	close(g.release)
	<-stalled
	err = <-answered
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorIs(t, err, errNotSent)
	waitIdle(t, l)
	require.False(t, mr.Exists(l.Key("u", "k")), "the write was not sent")
}

// setAndWait is Set, waiting for its answer.
func setAndWait(l *Locker, scope, key string, state []byte, ttl time.Duration) error {
	answered := make(chan error, 1)
	l.Set(scope, key, state, ttl, func(err error) { answered <- err })
	return <-answered
}

// A command queued behind a stalled exchange fails within its caller's
// Timeout with ErrUnavailable, not when the stall ends.
func TestPipelineQueuedCommandKeepsItsTimeout(t *testing.T) {
	mr := miniredis.RunT(t)
	c := testredis.Miniredis(t, mr)
	g := newGate()
	c.AddHook(g)
	l, err := New(c, &Config{Timeout: 50 * time.Millisecond})
	require.NoError(t, err)
	ctx := context.Background()

	go func() { _ = l.Delete(ctx, "u", "stalled") }()
	<-g.held
	defer close(g.release)

	_, _, err = l.Obtain(ctx, "u", "k", nil)
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// Shutdown refuses every later call without reaching Redis and returns once
// the writes queued before it have been answered: none is lost.
func TestPipelineShutdownSendsQueuedWrites(t *testing.T) {
	for _, b := range pipelineBackends {
		t.Run(b.name, func(t *testing.T) {
			c, _ := b.client(t)
			g := newGate()
			c.AddHook(g)
			l, err := New(c, &Config{Prefix: testredis.Prefix(t, c), Timeout: 5 * time.Second})
			require.NoError(t, err)
			ctx := context.Background()

			first := make(chan error, 1)
			go func() { first <- l.Delete(ctx, "u", "held") }()
			<-g.held
			const n = 32
			answered := make(chan error, n)
			for i := range n {
				l.Set("u", fmt.Sprint("k", i), []byte("copy"), time.Minute, func(err error) { answered <- err })
			}
			done := make(chan error, 1)
			go func() { done <- l.Shutdown(ctx) }()
			require.Eventually(t, func() bool {
				l.pipe.mu.Lock()
				defer l.pipe.mu.Unlock()
				return l.pipe.closed
			}, 10*time.Second, time.Millisecond)

			_, _, err = l.Obtain(ctx, "u", "after", nil)
			require.ErrorIs(t, err, ErrUnavailable)
			require.ErrorIs(t, err, errShutDown)
			refused := make(chan error, 1)
			l.Set("u", "after", []byte("copy"), time.Minute, func(err error) { refused <- err })
			require.ErrorIs(t, <-refused, errShutDown, "answered before Set returned")
			require.Equal(t, n, l.pipe.queued())
			select {
			case err := <-done:
				t.Fatalf("Shutdown returned (%v) with %d writes queued", err, n)
			default:
			}

			close(g.release)
			require.NoError(t, <-done)
			require.NoError(t, <-first)
			for range n {
				require.NoError(t, <-answered)
			}
			require.NoError(t, l.Shutdown(ctx), "a second Shutdown")
			keys := make([]string, n)
			for i := range keys {
				keys[i] = l.Key("u", fmt.Sprint("k", i))
			}
			in, err := c.Exists(ctx, keys...).Result()
			require.NoError(t, err)
			require.EqualValues(t, n, in, "every queued write is in Redis")
			in, err = c.Exists(ctx, l.Key("u", "after")).Result()
			require.NoError(t, err)
			require.Zero(t, in, "nothing reached Redis after Shutdown")
		})
	}
}

// exchanges is a go-redis hook that records the size of every exchange, a
// plain command as 1, but for the handshakes of the connections go-redis
// opens (HELLO, CLIENT SETINFO), which go through the hooks too.
type exchanges struct {
	mu    sync.Mutex
	sizes []int
}

func (e *exchanges) DialHook(next redis.DialHook) redis.DialHook { return next }

func (e *exchanges) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		e.add([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (e *exchanges) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		e.add(cmds)
		return next(ctx, cmds)
	}
}

func (e *exchanges) add(cmds []redis.Cmder) {
	if name := cmds[0].Name(); name == "hello" || name == "client" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sizes = append(e.sizes, len(cmds))
}

func (e *exchanges) all() []int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]int(nil), e.sizes...)
}

// lingeringLocker returns a Locker over c whose writes wait for a command's
// exchange to ride with (its linger is an hour), and the exchanges c makes
// from then on.
func lingeringLocker(t *testing.T, c *redis.Client) (*Locker, *exchanges) {
	t.Helper()
	l, err := New(c, &Config{Prefix: testredis.Prefix(t, c), Timeout: 5 * time.Second})
	require.NoError(t, err)
	l.pipe.linger = time.Hour
	ex := &exchanges{}
	c.AddHook(ex)
	return l, ex
}

// A write queued while nothing is out rides with the next command's
// exchange, sent from that caller's goroutine ahead of its command; with no
// command within the linger, it goes alone.
func TestPipelineSetRidesWithTheNextExchange(t *testing.T) {
	for _, b := range pipelineBackends {
		t.Run(b.name, func(t *testing.T) {
			c, _ := b.client(t)
			l, ex := lingeringLocker(t, c) // the test's next command always comes first
			ctx := context.Background()

			answered := make(chan error, 2)
			l.Set("u", "k", []byte("copy"), time.Minute, func(err error) { answered <- err })
			l.Set("u", "k2", []byte("copy2"), time.Minute, func(err error) { answered <- err })
			require.Empty(t, ex.all(), "the writes wait for an exchange")
			_, state, err := l.Obtain(ctx, "u", "k", []byte("claiming"))
			require.ErrorIs(t, err, ErrNotObtained, "the obtain went after the write it rode with")
			require.Equal(t, []byte("copy"), state)
			require.NoError(t, <-answered)
			require.NoError(t, <-answered)
			require.Equal(t, []int{4}, ex.all(), "two writes and an obtain's two commands, one exchange")

			l.pipe.linger = time.Millisecond
			require.NoError(t, setAndWait(l, "u", "alone", []byte("copy"), time.Minute))
			require.Equal(t, []int{4, 1}, ex.all(), "with no command to ride with, the write went alone")
			n, err := c.Exists(ctx, l.Key("u", "alone")).Result()
			require.NoError(t, err)
			require.EqualValues(t, 1, n)
		})
	}
}

// Writes queued while nothing is out wait for the linger together, and go at
// once, as one exchange, when they fill a batch.
func TestPipelineWritesGoWhenTheyFillABatch(t *testing.T) {
	for _, b := range pipelineBackends {
		t.Run(b.name, func(t *testing.T) {
			c, _ := b.client(t)
			l, ex := lingeringLocker(t, c) // only a full batch sends them

			answered := make(chan error, maxBatch)
			for i := range maxBatch - 1 {
				l.Set("u", strconv.Itoa(i), []byte("copy"), time.Minute, func(err error) { answered <- err })
			}
			require.Empty(t, ex.all(), "fewer writes than a batch wait for the linger")
			l.Set("u", "last", []byte("copy"), time.Minute, func(err error) { answered <- err })
			for range maxBatch {
				select {
				case err := <-answered:
					require.NoError(t, err)
				case <-time.After(10 * time.Second):
					t.Fatal("a full batch still waits for the linger")
				}
			}
			require.Equal(t, []int{maxBatch}, ex.all(), "a full batch went at once, in one exchange")
			n, err := c.Exists(context.Background(), l.Key("u", "0"), l.Key("u", "last")).Result()
			require.NoError(t, err)
			require.EqualValues(t, 2, n)
		})
	}
}

// Writes queued while an exchange is out, with no caller waiting among them,
// do not go out when it returns: like writes queued while nothing is out,
// they ride with the next command's exchange (or go after the linger).
func TestPipelineWritesQueuedDuringAnExchangeWaitForTheNext(t *testing.T) {
	for _, b := range pipelineBackends {
		t.Run(b.name, func(t *testing.T) {
			c, _ := b.client(t)
			g := newGate()
			c.AddHook(g)
			l, ex := lingeringLocker(t, c) // only a command sends them
			ctx := context.Background()

			first := make(chan error, 1)
			go func() { first <- l.Delete(ctx, "u", "held") }()
			<-g.held
			answered := make(chan error, 1)
			l.Set("u", "k", []byte("copy"), time.Minute, func(err error) { answered <- err })
			close(g.release)
			require.NoError(t, <-first)

			require.Equal(t, 1, l.pipe.queued(), "the write still waits once the exchange is back")
			require.Equal(t, []int{1}, ex.all(), "the delete went alone; nothing followed it")
			_, state, err := l.Obtain(ctx, "u", "k", []byte("claiming"))
			require.ErrorIs(t, err, ErrNotObtained, "the obtain went after the write it rode with")
			require.Equal(t, []byte("copy"), state)
			require.NoError(t, <-answered)
			require.Equal(t, []int{1, 3}, ex.all(), "the write and the obtain's two commands, one exchange")
		})
	}
}

// A write riding with a caller whose context ends during the exchange is not
// lost with it: it goes again with the next exchange.
func TestPipelineRiderOutlivesItsCarrier(t *testing.T) {
	mr := miniredis.RunT(t)
	c := testredis.Miniredis(t, mr)
	l, err := New(c, &Config{Timeout: 5 * time.Second})
	require.NoError(t, err)
	l.pipe.linger = time.Hour
	g := newGate()
	c.AddHook(g)

	answered := make(chan error, 1)
	l.Set("u", "k", []byte("copy"), time.Minute, func(err error) { answered <- err })
	gone, cancel := context.WithCancel(context.Background())
	obtained := make(chan error, 1)
	go func() {
		_, _, err := l.Obtain(gone, "u", "other", []byte("x"))
		obtained <- err
	}()
	<-g.held // the obtain carries the write
	cancel()
	close(g.release)
	require.ErrorIs(t, <-obtained, context.Canceled)
	require.NoError(t, <-answered, "the write went with the next exchange")
	waitIdle(t, l)
	v, err := mr.Get(l.Key("u", "k"))
	require.NoError(t, err)
	state, _ := parseValue(v)
	require.True(t, strings.HasPrefix(v, unowned), "written by Set: %q", v)
	require.Equal(t, "copy", string(state))
}
