package pgidem_test

import (
	"os"
	"testing"

	"github.com/idemguard/idem/internal/testdb"
)

// TestMain skips the examples that need PostgreSQL when it does not answer,
// as the tests skip (under CI=true both fail instead).
func TestMain(m *testing.M) {
	testdb.SkipExamples("ExampleNew_production", "ExampleConfig_wait", "ExampleNew")
	os.Exit(m.Run())
}
