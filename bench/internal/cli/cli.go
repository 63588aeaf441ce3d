// Package cli holds what the bench's commands share: their flags, how they
// were invoked, and the median they report.
package cli

import (
	"flag"
	"os"
	"slices"
	"strings"
)

// ServerFlags defines the -database-url and -redis-addr flags of fs, which
// default to $DATABASE_URL and $REDIS_ADDR, else the local servers.
func ServerFlags(fs *flag.FlagSet) (dbURL, redisAddr *string) {
	env := func(name, def string) string {
		if v := os.Getenv(name); v != "" {
			return v
		}
		return def
	}
	dbURL = fs.String("database-url", env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		"PostgreSQL URL (default $DATABASE_URL, else the local default)")
	redisAddr = fs.String("redis-addr", env("REDIS_ADDR", "127.0.0.1:6379"), "Redis address (default $REDIS_ADDR, else the local default)")
	return dbURL, redisAddr
}

// SettleFlag defines the -settle flag of fs: how many requests of a run's
// own mix go before it is measured. The hybrid's lease mode and the store's
// insert mode each switch within a window of 512 requests
// (internal/rare), so the default, 1,024, has a run measure its mix's
// steady state, not the switch from the mix before.
func SettleFlag(fs *flag.FlagSet) *int {
	return fs.Int("settle", 1024, "requests of a run's own mix sent before it is measured, so that the lease and insert modes settle")
}

// Split returns the non-empty, trimmed fields of a comma-separated flag.
func Split(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// CommandLine renders an invocation of cmd with the flags of fs that were
// set, the database URL redacted, for a report to say how to rerun it.
func CommandLine(cmd string, fs *flag.FlagSet) string {
	parts := []string{cmd}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "database-url" {
			parts = append(parts, "-database-url <redacted>")
			return
		}
		parts = append(parts, "-"+f.Name+" "+f.Value.String())
	})
	return strings.Join(parts, " ")
}

// Median is the median of xs, 0 for none.
func Median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s) == 0 {
		return 0
	}
	return (s[(len(s)-1)/2] + s[len(s)/2]) / 2 // one value twice when len is odd
}
