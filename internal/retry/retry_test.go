package retry

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeClock advances by every Sleep, at once.
type fakeClock struct {
	now    time.Time
	sleeps []time.Duration
}

func (f *fakeClock) clock() Clock {
	return Clock{
		Now: func() time.Time { return f.now },
		Sleep: func(_ context.Context, d time.Duration) error {
			f.sleeps = append(f.sleeps, d)
			f.now = f.now.Add(d)
			return nil
		},
	}
}

func policy(t *testing.T, p Policy) Policy {
	t.Helper()
	p, err := p.WithDefaults("Config")
	require.NoError(t, err)
	return p
}

func TestWithDefaults(t *testing.T) {
	p := policy(t, Policy{})
	require.Equal(t, Policy{MaxAttempts: DefaultMaxAttempts, MaxElapsed: DefaultMaxElapsed,
		BaseDelay: DefaultBaseDelay, MaxDelay: DefaultMaxDelay}, p)
	for _, tc := range []struct {
		p    Policy
		want string
	}{
		{Policy{MaxAttempts: -1}, "Config.MaxAttempts -1 must not be negative"},
		{Policy{MaxElapsed: -1}, "Config.MaxElapsed -1ns must not be negative"},
		{Policy{BaseDelay: -1}, "Config.BaseDelay -1ns must not be negative"},
		{Policy{MaxDelay: -1}, "Config.MaxDelay -1ns must not be negative"},
		{Policy{BaseDelay: 2 * time.Second, MaxDelay: time.Second}, "Config.BaseDelay 2s must not exceed Config.MaxDelay 1s"},
	} {
		_, err := tc.p.WithDefaults("Config")
		require.EqualError(t, err, tc.want)
	}
}

func TestWaitHonoursTheHint(t *testing.T) {
	f := &fakeClock{now: time.Unix(1000, 0)}
	c := Start(policy(t, Policy{}), f.clock())
	d, err := c.Wait(t.Context(), 3*time.Second)
	require.NoError(t, err)
	require.Equal(t, 3*time.Second, d)
	require.Equal(t, []time.Duration{3 * time.Second}, f.sleeps)
	require.Equal(t, 2, c.Attempts())
}

func TestWaitBackoffIsCappedFullJitter(t *testing.T) {
	p := policy(t, Policy{MaxAttempts: 1000, MaxElapsed: time.Hour * 1000, BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second})
	for range 50 {
		f := &fakeClock{now: time.Unix(1000, 0)}
		c := Start(p, f.clock())
		for n := 1; n <= 8; n++ {
			d, err := c.Wait(t.Context(), 0)
			require.NoError(t, err)
			ceiling := min(time.Second, 100*time.Millisecond<<(n-1))
			require.GreaterOrEqual(t, d, time.Duration(0))
			require.LessOrEqual(t, d, ceiling, "after attempt %d", n)
		}
	}
}

func TestWaitStopsAtMaxAttempts(t *testing.T) {
	f := &fakeClock{now: time.Unix(1000, 0)}
	c := Start(policy(t, Policy{MaxAttempts: 3}), f.clock())
	for range 2 {
		_, err := c.Wait(t.Context(), time.Second)
		require.NoError(t, err)
	}
	_, err := c.Wait(t.Context(), time.Second)
	require.ErrorIs(t, err, ErrExhausted)
	require.Equal(t, 3, c.Attempts())
	require.Len(t, f.sleeps, 2)
}

func TestWaitStopsBeforeMaxElapsed(t *testing.T) {
	f := &fakeClock{now: time.Unix(1000, 0)}
	c := Start(policy(t, Policy{MaxElapsed: 10 * time.Second}), f.clock())
	_, err := c.Wait(t.Context(), 6*time.Second)
	require.NoError(t, err)
	_, err = c.Wait(t.Context(), 6*time.Second) // would start 12s after the first
	require.ErrorIs(t, err, ErrExhausted)
	require.Len(t, f.sleeps, 1, "it does not wait for an attempt it will not make")
}

func TestWaitStopsBeforeTheDeadline(t *testing.T) {
	f := &fakeClock{now: time.Now()}
	ctx, cancel := context.WithDeadline(t.Context(), f.now.Add(5*time.Second))
	defer cancel()
	c := Start(policy(t, Policy{}), f.clock())
	_, err := c.Wait(ctx, 2*time.Second)
	require.NoError(t, err)
	_, err = c.Wait(ctx, 3*time.Second) // would start exactly at the deadline
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Len(t, f.sleeps, 1)
}

func TestWaitEndsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	c := Start(policy(t, Policy{}), RealClock)
	_, err := c.Wait(ctx, time.Hour)
	require.ErrorIs(t, err, context.Canceled)

	ctx, cancel = context.WithCancel(t.Context())
	clock := RealClock
	clock.Sleep = func(ctx context.Context, d time.Duration) error { cancel(); return sleep(ctx, d) }
	c = Start(policy(t, Policy{MaxElapsed: 2 * time.Hour}), clock)
	_, err = c.Wait(ctx, time.Hour)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 1, c.Attempts())
}

func TestEnded(t *testing.T) {
	require.NoError(t, Ended(t.Context()))
	past, cancel := context.WithDeadline(context.WithoutCancel(t.Context()), time.Now().Add(-time.Second))
	defer cancel()
	require.ErrorIs(t, Ended(past), context.DeadlineExceeded)
	canceled, cancel2 := context.WithCancel(t.Context())
	cancel2()
	require.ErrorIs(t, Ended(canceled), context.Canceled)
}
