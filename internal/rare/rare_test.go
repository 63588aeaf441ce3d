package rare_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/internal/rare"
)

// Duplicates become rare after a window with at most enter of them, and
// stop being rare at the leave-th duplicate of a window, without waiting
// for its end.
func TestWindowFollowsDuplicates(t *testing.T) {
	w := rare.New(10, 1, 3)
	feed := func(firsts, dups int) (switches int) {
		for range firsts {
			if w.Observe(false) {
				switches++
			}
		}
		for range dups {
			if w.Observe(true) {
				switches++
			}
		}
		return switches
	}
	require.False(t, w.Rare(), "a new Window does not find duplicates rare")

	require.Zero(t, feed(8, 2), "two duplicates in ten are more than enter")
	require.False(t, w.Rare())
	require.Equal(t, 1, feed(9, 1), "one duplicate in ten is at most enter")
	require.True(t, w.Rare())

	// Two duplicates per window never reach leave: the counts start again
	// with each window.
	for range 5 {
		require.Zero(t, feed(8, 2))
		require.True(t, w.Rare())
	}
	// The third duplicate of a window switches at once, four requests in.
	require.Equal(t, 1, feed(1, 3))
	require.False(t, w.Rare())
	// The switch starts a new window: nine new keys and one duplicate
	// later, duplicates are rare again.
	require.Equal(t, 1, feed(9, 1))
	require.True(t, w.Rare())
}

// The thresholds keep a gap between entering and leaving, so that a share
// of duplicates between them does not flip at every window.
func TestThresholds(t *testing.T) {
	require.Less(t, int64(rare.Enter), int64(rare.Leave))
	require.Less(t, int64(rare.Leave), int64(rare.Size))
	require.Positive(t, int64(rare.Enter))
}

// A pinned Window keeps its answer, whatever it observes.
func TestPin(t *testing.T) {
	for _, pinned := range []bool{true, false} {
		w := rare.New(rare.Size, rare.Enter, rare.Leave)
		w.Pin(pinned)
		for range 3 * rare.Size {
			require.False(t, w.Observe(!pinned))
		}
		require.Equal(t, pinned, w.Rare())
	}
}
