package grpcidem_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestMain skips the example, which needs PostgreSQL, when it does not
// answer, as the tests skip (under CI=true both fail instead). It is the
// root's testdb.SkipExamples, kept here so that this module's tests build
// against the root it pins.
func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv("CI") != "true" {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, databaseURL())
		if err == nil {
			_ = conn.Close(ctx)
		} else if skip := flag.Lookup("test.skip"); skip != nil {
			pattern := "^ExampleUnaryServerInterceptor$"
			if old := skip.Value.String(); old != "" {
				pattern = old + "|" + pattern
			}
			if flag.Set("test.skip", pattern) == nil {
				fmt.Fprintf(os.Stderr, "grpcidem: PostgreSQL unreachable (%v): skipping ExampleUnaryServerInterceptor (CI=true runs it)\n", err)
			}
		}
		cancel()
	}
	os.Exit(m.Run())
}
