package durable_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
)

// This example creates the table, claims a key, stores the answer and shows
// what a retry of the same request finds. It needs PostgreSQL at
// $TEST_DATABASE_URL (by default postgres://postgres@127.0.0.1:5432/postgres).
func ExampleMigrate() {
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

	// A schema of the example's own; a service would use a fixed one, or
	// none (the connection's current schema).
	suffix := newToken()
	cfg := &durable.Config{Schema: "idem_example_" + hex.EncodeToString(suffix[:4])}
	defer pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+cfg.Schema+" CASCADE")

	// Safe to run from every instance at start-up.
	if err := durable.Migrate(ctx, pool, cfg); err != nil {
		log.Fatal(err)
	}
	store, err := durable.New(pool, cfg)
	if err != nil {
		log.Fatal(err)
	}

	// The first request under the key claims it and runs.
	body := []byte(`{"sku":"A1","qty":2}`)
	first := idem.ClaimParams{
		Scope:       "user-42",
		Key:         "7d1c0f9e-order",
		Fingerprint: sha256.Sum256(body),
		Owner:       newToken(),
	}
	_, claimed, err := store.Claim(ctx, first)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("first request claimed the key:", claimed)
	err = store.Complete(ctx, first.Scope, first.Key, first.Owner,
		idem.Response{Status: 201, Body: []byte(`{"order":1}`)})
	if err != nil {
		log.Fatal(err)
	}

	// A retry of the same request does not run again: it gets the answer.
	retry := first
	retry.Owner = newToken()
	rec, claimed, err := store.Claim(ctx, retry)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("retry claimed the key:", claimed)
	fmt.Println("same request:", rec.Fingerprint == retry.Fingerprint)
	fmt.Println("stored answer:", rec.Answer.Status, string(rec.Answer.Body))

	// Output:
	// first request claimed the key: true
	// retry claimed the key: false
	// same request: true
	// stored answer: 201 {"order":1}
}

// newToken returns a random owner token.
func newToken() idem.Token {
	var t idem.Token
	rand.Read(t[:])
	return t
}
