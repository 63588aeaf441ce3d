package idemclient

import (
	"context"
	"time"

	"github.com/idemguard/idem/internal/retry"
)

// SetClock replaces t's clock: now reads the time, sleep waits before a
// retry. Tests use it to see each delay and not wait for it.
func SetClock(t *Transport, now func() time.Time, sleep func(ctx context.Context, d time.Duration) error) {
	t.clock = retry.Clock{Now: now, Sleep: sleep}
}

// RetryAfter is retryAfter, for its table test.
var RetryAfter = retryAfter
