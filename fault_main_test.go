package idem_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/idemguard/idem/internal/testdb"
)

// TestMain fails the package if any goroutine outlives its tests. The guard
// starts none of its own, so a leftover goroutine is a leak: a test that did
// not close what it opened, or a guard path (a lease release, a store call)
// that never returned.
//
// Nothing is ignored: every pgxpool and go-redis client, miniredis server,
// httptest server, fault proxy and throwaway server is closed at Cleanup,
// before goleak looks, and goleak retries while goroutines are exiting.
//
// The examples that need PostgreSQL are skipped when it does not answer, as
// the tests skip (under CI=true both fail instead).
func TestMain(m *testing.M) {
	testdb.SkipExamples("ExampleGuard_Middleware_quickStart", "ExampleMiddlewareConfig_wait", "ExampleComplete",
		"ExampleGuard_Middleware", "ExampleGuard_Do")
	goleak.VerifyTestMain(m)
}
