package durable_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
)

// This example sweeps expired keys once, as a cron job would; a service
// runs the same Sweeper with Run on every instance instead (one sweeps at a
// time). It needs PostgreSQL at $TEST_DATABASE_URL (by default
// postgres://postgres@127.0.0.1:5432/postgres).
func ExampleSweeper_SweepOnce() {
	ctx := context.Background()
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	// A retention of one microsecond, so that the key below has expired by
	// the time the sweep runs; keep the default (24h) or longer in a service.
	cfg := &durable.Config{Schema: fmt.Sprintf("idem_example_%x", suffix), Retention: time.Microsecond}
	defer pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+cfg.Schema+" CASCADE")
	if err := durable.Migrate(ctx, pool, cfg); err != nil {
		log.Fatal(err)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil)) // the sweeper's; give it the Guard's
	store, err := durable.New(pool, cfg)
	if err != nil {
		log.Fatal(err)
	}
	owner := newToken()
	if _, _, err := store.Claim(ctx, idem.ClaimParams{Scope: "user-42", Key: "k1", Owner: owner}); err != nil {
		log.Fatal(err)
	}
	// A key expires once answered (or released); one in progress never does.
	if err := store.Complete(ctx, "user-42", "k1", owner, idem.Response{Status: 201}); err != nil {
		log.Fatal(err)
	}

	sweeper, err := durable.NewSweeper(store) // hourly with Run; once here
	if err != nil {
		log.Fatal(err)
	}
	n, err := sweeper.SweepOnce(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("swept", n, "expired keys")

	// Output:
	// swept 1 expired keys
}
