package idem_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives its tests. The guard
// starts none of its own, so a leftover goroutine is a leak: a test that did
// not close what it opened, or a guard path (a lease release, a store call)
// that never returned.
//
// Nothing is ignored: every pgxpool and go-redis client, miniredis server,
// httptest server, fault proxy and throwaway server is closed at Cleanup,
// before goleak looks, and goleak retries while goroutines are exiting.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
