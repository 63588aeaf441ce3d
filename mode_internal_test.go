package idem

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The lease mode follows the share of duplicates: claim first after a window
// with at most enter of them, lease first again at the leave-th duplicate of
// a window claiming first, without waiting for its end.
func TestLeaseModeFollowsDuplicates(t *testing.T) {
	m := leaseMode{window: 10, enter: 1, leave: 3}
	feed := func(firsts, dups int) (switches int) {
		for range firsts {
			if m.observe(false) {
				switches++
			}
		}
		for range dups {
			if m.observe(true) {
				switches++
			}
		}
		return switches
	}
	require.False(t, m.first(), "a new Guard leases first")

	require.Zero(t, feed(8, 2), "two duplicates in ten are more than enter")
	require.False(t, m.first())
	require.Equal(t, 1, feed(9, 1), "one duplicate in ten is at most enter")
	require.True(t, m.first())

	// Claiming first, two duplicates per window never reach leave: the
	// counts start again with each window.
	for range 5 {
		require.Zero(t, feed(8, 2))
		require.True(t, m.first())
	}
	// The third duplicate of a window switches at once, four requests in.
	require.Equal(t, 1, feed(1, 3))
	require.False(t, m.first())
	// The switch starts a new window: nine new keys and one duplicate
	// later, the Guard claims first again.
	require.Equal(t, 1, feed(9, 1))
	require.True(t, m.first())
}

// The thresholds keep a gap between entering and leaving, so that a share
// of duplicates between them does not flip the mode at every window.
func TestLeaseModeThresholds(t *testing.T) {
	require.Less(t, int64(enterClaimFirst), int64(leaveClaimFirst))
	require.Less(t, int64(leaveClaimFirst), int64(leaseWindow))
	require.Positive(t, int64(enterClaimFirst))
}
