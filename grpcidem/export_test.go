package grpcidem

import (
	"context"
	"time"

	"google.golang.org/grpc"

	"github.com/idemguard/idem/internal/retry"
)

// UnaryClientInterceptorWithClock is UnaryClientInterceptor with its clock
// replaced: now reads the time, sleep waits before a retry. Tests use it to
// see each delay and not wait for it.
func UnaryClientInterceptorWithClock(cfg *ClientConfig, now func() time.Time, sleep func(ctx context.Context, d time.Duration) error) grpc.UnaryClientInterceptor {
	return newClientInterceptor(cfg, retry.Clock{Now: now, Sleep: sleep})
}
