package idem

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type boundKey struct{}

// A bounded behaves as context.WithDeadline whether or not anybody asks for
// its Done channel, and whenever they ask.
func TestBounded(t *testing.T) {
	const d = 30 * time.Millisecond
	closed := func(t *testing.T, c context.Context) {
		t.Helper()
		select {
		case <-c.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("Done not closed")
		}
	}
	open := func(t *testing.T, c context.Context) {
		t.Helper()
		select {
		case <-c.Done():
			t.Fatal("Done closed early")
		default:
		}
	}
	for _, tc := range []struct {
		name string
		test func(t *testing.T, c *bounded, parent context.Context, cancel context.CancelCauseFunc)
	}{
		{"deadline polled through Err, no timer", func(t *testing.T, c *bounded, _ context.Context, _ context.CancelCauseFunc) {
			require.NoError(t, c.Err())
			time.Sleep(d)
			require.ErrorIs(t, c.Err(), context.DeadlineExceeded)
			closed(t, c) // asked for after it expired: already closed
			require.ErrorIs(t, c.Err(), context.DeadlineExceeded)
			require.ErrorIs(t, context.Cause(c), context.DeadlineExceeded)
		}},
		{"deadline through Done", func(t *testing.T, c *bounded, _ context.Context, _ context.CancelCauseFunc) {
			open(t, c)
			require.NoError(t, c.Err())
			closed(t, c)
			require.False(t, time.Now().Before(c.deadline), "closed before the deadline")
			require.ErrorIs(t, c.Err(), context.DeadlineExceeded)
			require.ErrorIs(t, context.Cause(c), context.DeadlineExceeded)
		}},
		{"parent cancelled, no timer", func(t *testing.T, c *bounded, _ context.Context, cancel context.CancelCauseFunc) {
			cancel(errHungUp)
			require.ErrorIs(t, c.Err(), context.Canceled)
			closed(t, c)
			require.ErrorIs(t, context.Cause(c), errHungUp)
		}},
		{"parent cancelled while waiting", func(t *testing.T, c *bounded, _ context.Context, cancel context.CancelCauseFunc) {
			open(t, c)
			cancel(errHungUp)
			closed(t, c)
			require.ErrorIs(t, c.Err(), context.Canceled)
			require.ErrorIs(t, context.Cause(c), errHungUp)
		}},
		{"ended, no timer", func(t *testing.T, c *bounded, _ context.Context, _ context.CancelCauseFunc) {
			c.end()
			require.ErrorIs(t, c.Err(), context.Canceled)
			closed(t, c)
			require.ErrorIs(t, c.Err(), context.Canceled)
		}},
		{"ended while waiting", func(t *testing.T, c *bounded, _ context.Context, _ context.CancelCauseFunc) {
			open(t, c)
			c.end()
			closed(t, c)
			require.ErrorIs(t, c.Err(), context.Canceled)
		}},
		{"ended after its deadline", func(t *testing.T, c *bounded, _ context.Context, _ context.CancelCauseFunc) {
			time.Sleep(d)
			c.end()
			require.ErrorIs(t, c.Err(), context.DeadlineExceeded)
		}},
		{"derived contexts expire with it", func(t *testing.T, c *bounded, _ context.Context, _ context.CancelCauseFunc) {
			child, cancel := context.WithCancel(c)
			defer cancel()
			fired := make(chan struct{})
			stop := context.AfterFunc(c, func() { close(fired) })
			defer stop()
			closed(t, child)
			require.ErrorIs(t, child.Err(), context.DeadlineExceeded)
			<-fired
		}},
		{"values and deadline", func(t *testing.T, c *bounded, parent context.Context, _ context.CancelCauseFunc) {
			require.Equal(t, "v", c.Value(boundKey{}))
			dl, ok := c.Deadline()
			require.True(t, ok)
			require.Equal(t, c.deadline, dl)
			_ = c.Done()
			require.Equal(t, "v", c.Value(boundKey{}), "also through the timer context")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), boundKey{}, "v"))
			defer cancel(nil)
			c := new(bounded)
			c.start(parent, time.Now().Add(d))
			defer c.end()
			tc.test(t, c, parent, cancel)
		})
	}
}

var errHungUp = errors.New("client hung up")

// The parent's deadline, when earlier, is the bounded's, as with
// context.WithDeadline.
func TestBoundedParentDeadlineFirst(t *testing.T) {
	parent, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	pd, _ := parent.Deadline()
	c := new(bounded)
	c.start(parent, time.Now().Add(time.Hour))
	defer c.end()
	dl, ok := c.Deadline()
	require.True(t, ok)
	require.Equal(t, pd, dl)
	<-c.Done()
	require.ErrorIs(t, c.Err(), context.DeadlineExceeded)
}

// Done, Err, Value and end from many goroutines at once (run with -race).
func TestBoundedConcurrent(t *testing.T) {
	for range 50 {
		c := new(bounded)
		c.start(context.Background(), time.Now().Add(time.Millisecond))
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				switch i % 3 {
				case 0:
					<-c.Done()
				case 1:
					for c.Err() == nil {
						time.Sleep(100 * time.Microsecond)
					}
				default:
					_ = c.Value(boundKey{})
				}
			})
		}
		wg.Wait()
		c.end()
		require.ErrorIs(t, c.Err(), context.DeadlineExceeded)
	}
}
