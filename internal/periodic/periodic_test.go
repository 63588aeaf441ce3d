package periodic_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemguard/idem/internal/periodic"
)

func TestRunRepeatsUntilCancelled(t *testing.T) {
	defer goleak.VerifyNone(t)
	var r periodic.Runner
	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int32
	done := make(chan bool)
	go func() {
		done <- r.Run(ctx, time.Millisecond, func(context.Context) {
			if calls.Add(1) == 3 {
				cancel()
			}
		})
	}()
	require.True(t, <-done)
	require.EqualValues(t, 3, calls.Load(), "a cancelled ctx stops the loop before the next call")
}

func TestRunOnceAtATime(t *testing.T) {
	defer goleak.VerifyNone(t)
	var r periodic.Runner
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	done := make(chan bool)
	go func() {
		done <- r.Run(ctx, time.Hour, func(ctx context.Context) {
			close(started)
			<-ctx.Done()
		})
	}()
	<-started
	require.False(t, r.Run(ctx, time.Hour, func(context.Context) { t.Error("second Run ran a job") }))
	cancel()
	require.True(t, <-done)
}

func TestRunFirstCallIsImmediate(t *testing.T) {
	defer goleak.VerifyNone(t)
	var r periodic.Runner
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	ran := make(chan time.Duration, 1)
	go r.Run(ctx, time.Hour, func(context.Context) {
		ran <- time.Since(start)
		cancel()
	})
	require.Less(t, <-ran, time.Second)
}
