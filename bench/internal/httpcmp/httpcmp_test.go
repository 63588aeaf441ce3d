package httpcmp

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The report pairs each round's hybrid run with its table run, per
// implementation, and leaves out the ratios of implementations not run.
func TestReportComparesStrategiesRoundByRound(t *testing.T) {
	cfg := config{callers: []int{8}, strategies: []string{"table", "hybrid"}, impls: []string{Guard},
		rounds: 2, run: time.Second, replayKeys: 1, scenarios: []string{Unique, Replay}}
	var runs []Run
	for i, n := range []int64{1000, 900, 1000, 1200} { // table, hybrid; round 1, round 2
		for _, sc := range []string{Unique, Replay} {
			runs = append(runs, Run{Strategy: []string{"table", "hybrid"}[i%2], Scenario: sc, Impl: Guard, Callers: 8,
				Round: 1 + i/2, Requests: n, Elapsed: time.Second})
		}
	}
	var b strings.Builder
	markdown(&b, cfg, runs, "go run ./bench http", time.Now(), false)
	md := b.String()
	require.Contains(t, md, "| unique | 8 | 1.05 (0.90–1.20) |")
	require.Contains(t, md, "| replay | 8 | 1.05 (0.90–1.20) |")
	require.NotContains(t, md, "guard ÷ minimal", "minimal did not run")
}
