// Command idem is the operators' tool for idem's PostgreSQL table: it
// migrates it, looks at a key (its state, holder and remaining hold,
// attempt, intent, stored answer, remaining retention, and with -redis its
// lease), lists the keys waiting for reconciliation, counts keys per state,
// and settles or releases a key left in progress by hand, owner-checked and
// with an audit line on stderr.
//
//	go run github.com/idemguard/idem/cmd/idem <command> [flags]
//
// It runs no SQL of its own: every statement is durable's, and a settle or
// release is the owner-checked write of the Guard and the reconciler
// (idem.Guard.Settle and idem.Guard.Release, so durable.Store.Complete and
// durable.Store.Release). See docs/operating.md, "The idem command".
//
// Exit status: 0 when the command did what it was asked, 1 when it failed or
// refused (a key still held, the wrong owner, a table not migrated), 2 for a
// usage error.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
