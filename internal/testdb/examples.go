package testdb

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// SkipExamples skips the runnable examples named when PostgreSQL (URL())
// does not answer, as Pool skips a test: an example cannot skip itself, and
// would fail instead. Call it first in the package's TestMain; it adds the
// names to -test.skip and says so on stderr. Under CI=true it does nothing,
// so the examples run and fail without the database.
func SkipExamples(examples ...string) {
	if !flag.Parsed() {
		flag.Parse()
	}
	if os.Getenv("CI") == "true" || len(examples) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, URL())
	if err == nil {
		_ = conn.Close(ctx)
		return
	}
	skip := flag.Lookup("test.skip")
	if skip == nil {
		return
	}
	pattern := "^(" + strings.Join(examples, "|") + ")$"
	if old := skip.Value.String(); old != "" {
		pattern = old + "|" + pattern
	}
	if err := flag.Set("test.skip", pattern); err != nil {
		return
	}
	fmt.Fprintf(os.Stderr, "testdb: PostgreSQL unreachable at %s (%v): skipping %s (CI=true runs them)\n",
		redact(URL()), err, strings.Join(examples, ", "))
}
