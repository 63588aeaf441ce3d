// Command bench is idem's capacity planner. It drives the real Guard against
// a real PostgreSQL and Redis and answers two questions:
//
//	bench crossover   from which share of retries, and at which distance of
//	                  PostgreSQL, does the hybrid's Redis lease pay?
//	bench http        what does the whole request cost over HTTP, against the
//	                  least SQL that does the job, with durable or asynchronous
//	                  answers and with or without shared commits?
//
// From the repository root, go run ./bench crossover (or http); installed with
// go install github.com/idemguard/idem/bench@latest, bench crossover. Each
// command's -h lists its flags. Each works in a schema (idem_bench_<random>)
// and under a Redis prefix (idembench:<random>:) of its own, both removed at
// the end, so it never touches an application's data. Ctrl-C stops it and
// still writes the report of what ran.
//
// See bench/README.md for how to read the reports.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/idemguard/idem/bench/internal/crossover"
	"github.com/idemguard/idem/bench/internal/delayproxy"
	"github.com/idemguard/idem/bench/internal/fleet"
	"github.com/idemguard/idem/bench/internal/httpcmp"
)

func main() {
	if fleet.IsWorker() { // bench http re-runs this binary as its workers
		os.Exit(fleet.Serve(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C kills at once
	}()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage: bench <command> [flags]

Capacity planner of idem: drives the real Guard against PostgreSQL and Redis.

Commands:
  crossover   retry share x PostgreSQL distance, both strategies: from which share the Redis lease pays
  http        the whole request over HTTP: the guard against the minimal SQL, durable and
              asynchronous answers, shared commits on and off, flushes per first execution and CPU
              per request of each process

Run bench <command> -h for its flags. See bench/README.md.
`

// run is the command with its arguments; it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "crossover":
		return crossover.Command(ctx, args[1:], stdout, stderr)
	case "http":
		return httpcmp.Command(ctx, args[1:], stdout, stderr)
	case "delayproxy": // run by crossover and http as their delay proxy
		return delayproxy.Command(args[1:], os.Stdin, stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "bench: unknown command %q\n\n%s", args[0], usage)
	return 2
}
