// Package cli holds what the bench's commands share to read their flags and
// to print how they were invoked.
package cli

import (
	"flag"
	"strings"
)

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
