// Package heavy gates the tests that take minutes on a busy machine: the
// million-row plan test, the Redis Cluster and throwaway-PostgreSQL fault
// tests, the tests that run many service processes. A plain `go test ./...`
// skips them, so that it stays quick; CI runs them.
//
// They run when IDEM_TEST_HEAVY=1, and when CI=true unless IDEM_TEST_HEAVY=0.
// .ci/run sets IDEM_TEST_HEAVY=1.
package heavy

import (
	"os"
	"testing"
)

// Env is the variable that turns the heavy tests on ("1") or off ("0").
const Env = "IDEM_TEST_HEAVY"

// Enabled reports whether heavy tests run: Env is "1", or CI is "true" and
// Env is not "0".
func Enabled() bool {
	switch os.Getenv(Env) {
	case "1":
		return true
	case "0":
		return false
	}
	return os.Getenv("CI") == "true"
}

// Gate skips tb unless heavy tests run, saying how to run it.
func Gate(tb testing.TB) {
	tb.Helper()
	if !Enabled() {
		tb.Skip("heavy test: runs with " + Env + "=1 (set by .ci/run)")
	}
}
