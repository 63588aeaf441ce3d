// Package report turns the capacity planner's measurements into its outputs:
// fixed-width progress lines, the final summary, and a report folder with
// report.md, results.csv and plots (p99.png, throughput.png).
package report

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// Row is one step of one target: a strategy (table or hybrid) through one
// implementation (the guard, the ceiling of its bare statements, or the
// minimal SQL) at one offered rate of one scenario.
type Row struct {
	Scenario string  // unique, storm, mix
	Pattern  string  // the scenario's parameters, e.g. "storm K=5 in 20ms"
	DupShare float64 // share of requests that are retries
	Strategy string  // table, hybrid
	Impl     string  // guard, ceiling, minimal
	// Run numbers a repeat of the noise phase (1, 2, ...); 0 for a
	// ladder's step.
	Run int

	Offered  float64 // requests per second scheduled
	Achieved float64 // requests per second completed without error

	// Latency from each request's intended start (queueing included).
	P50, P90, P99, P999, Max time.Duration
	// Service time from the actual start (queueing excluded).
	SvcP50, SvcP99 time.Duration

	Requests int64 // completed, with or without error
	Errors   int64 // failed requests
	Dropped  int64 // arrivals never issued (the step's drain ran out)

	Executed, Replayed, InProgress, KeyReused int64

	// Per completed request.
	PGStatements float64 // statements sent (client-side count = round trips)
	TupleWrites  float64 // n_tup_ins+n_tup_upd+n_tup_del on the target's table
	WALBytes     float64 // WAL generated, server-wide
	RedisServer  float64 // INFO commandstats calls, server-wide
	RedisClient  float64 // commands the client sent

	Saturated   bool
	Interrupted bool
	Note        string // why saturated, or the first error
}

// ErrorRate is the share of scheduled requests that failed or were dropped.
func (r *Row) ErrorRate() float64 {
	n := r.Requests + r.Dropped
	if n == 0 {
		return 0
	}
	return float64(r.Errors+r.Dropped) / float64(n)
}

// Setup describes the machine, the servers and the flags of a run.
type Setup struct {
	Command     string
	Started     time.Time
	Finished    time.Time
	Interrupted bool

	GoVersion  string
	OS, Arch   string
	CPUs       int
	GOMAXPROCS int
	CPUModel   string
	// LoadAverage is the machine's 1, 5, 15 minute load average when the
	// run started: anything else running skews the figures.
	LoadAverage string
	Servers     map[string]string // versions and settings

	Step        time.Duration
	Drain       time.Duration
	Rates       []float64
	MaxInFlight int
	PoolSize    int
	Work        time.Duration
	Dup         float64
	StormK      int
	StormWindow time.Duration
	MaxP99      time.Duration
	// StatsExact is false when the PostgreSQL statistics could not be
	// flushed on demand (PostgreSQL < 15): tuple writes may lag a step.
	StatsExact bool
}

// Report is everything a run measured.
type Report struct {
	Setup Setup
	// Rows are the ladders' steps.
	Rows []Row
	// Repeats are the noise phase's steps: one step (the first scenario's
	// lowest offered rate) run several times per target, from which
	// [Report.Noise] comes. They are not part of the ladders.
	Repeats []Row
	// Instances are the many-instance ladders' steps: the guard in worker
	// processes, driven over HTTP. A run has either these or Rows.
	Instances []InstanceRow
}

// Scenarios returns the scenarios present, in order of first appearance.
func (r *Report) Scenarios() []string {
	return distinct(r.Rows, func(row Row) string { return row.Scenario })
}

// distinct returns the keys of rows, each once, in order of first
// appearance.
func distinct[R any, K comparable](rows []R, key func(R) K) []K {
	var out []K
	for _, row := range rows {
		if k := key(row); !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

// Series returns the rows of one scenario, strategy and implementation,
// ordered by offered rate, without interrupted steps.
func (r *Report) Series(scenario, strategy, impl string) []Row {
	var out []Row
	for _, row := range r.Rows {
		if row.Scenario == scenario && row.Strategy == strategy && row.Impl == impl && !row.Interrupted {
			out = append(out, row)
		}
	}
	slices.SortStableFunc(out, func(a, b Row) int { return cmp.Compare(a.Offered, b.Offered) })
	return out
}

// ms formats a duration in milliseconds with a precision that suits it.
func ms(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0fms", v)
	case v >= 10:
		return fmt.Sprintf("%.1fms", v)
	}
	return fmt.Sprintf("%.2fms", v)
}

// Header is the header of the fixed-width progress lines.
func Header() string {
	return fmt.Sprintf("%-8s %-8s %-8s %8s %8s %9s %9s %9s %9s %6s %6s %6s %7s  %s",
		"scenario", "strategy", "impl", "offered", "achieved", "p50", "p90", "p99", "p99.9",
		"err%", "pg/rq", "wr/rq", "rds/rq", "status")
}

// Line is one fixed-width progress line.
func Line(r Row) string {
	status := "ok"
	switch {
	case r.Interrupted:
		status = "interrupted"
	case r.Saturated:
		status = "SATURATED: " + r.Note
	}
	if r.Run > 0 {
		status = fmt.Sprintf("repeat %d: %s", r.Run, status)
	}
	return fmt.Sprintf("%-8s %-8s %-8s %8.0f %8.0f %9s %9s %9s %9s %6.2f %6.2f %6.2f %7.2f  %s",
		r.Scenario, r.Strategy, r.Impl, r.Offered, r.Achieved, ms(r.P50), ms(r.P90), ms(r.P99), ms(r.P999),
		100*r.ErrorRate(), r.PGStatements, r.TupleWrites, r.RedisServer, status)
}
