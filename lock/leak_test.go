package lock_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives its tests. The Locker
// starts none: every goroutine left is a go-redis client or a miniredis
// server that a test did not close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
