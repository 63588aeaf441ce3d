package lock

import (
	"context"
	"fmt"
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
	go func() { first <- l.Set(ctx, "u", "first", []byte("x"), time.Minute) }()
	<-g.held

	gone, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- l.Set(gone, "u", "gone", []byte("x"), time.Minute) }()
	require.Eventually(t, func() bool { return l.pipe.queued() == 1 }, 10*time.Second, time.Millisecond)
	cancel()
	err = <-errc
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, ErrUnavailable, "the caller gave up; Redis was not at fault")

	close(g.release)
	require.NoError(t, <-first)
	// Once the pipeline is idle again, the gone caller's SET was not sent.
	require.Eventually(t, func() bool {
		l.pipe.mu.Lock()
		defer l.pipe.mu.Unlock()
		return !l.pipe.busy
	}, 10*time.Second, time.Millisecond)
	require.True(t, mr.Exists(l.Key("u", "first")))
	require.False(t, mr.Exists(l.Key("u", "gone")))
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
