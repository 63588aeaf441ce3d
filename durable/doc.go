// Package durable is idem's PostgreSQL store: it implements the contract
// that package idem defines (idem.Store, idem.Record, idem.Token and the
// store's errors) with one row per scope (the user) and Idempotency-Key,
// holding the fingerprint of the first request, the token of the worker that
// owns it and, once the request has finished, its answer (status, headers,
// body).
//
// # The table
//
// [Migrate] creates the table, by default idempotency_keys in the
// connection's current schema (see [Config] and package migrations):
//
//	user_id, key       text, the primary key
//	request_hash       bytea, the 32-byte SHA-256 idem.Fingerprint
//	owner_token        bytea, the 16-byte owner idem.Token of the current attempt
//	created_at         timestamptz, the database's now() at the attempt's claim
//	hold_until         timestamptz, created_at plus the attempt's hold
//	retention          interval, how long the row lives after its answer or release
//	reconcile_attempts integer, failed reconciliation attempts
//	intent_id          bytea, the 16-byte intent, kept across releases
//	attempt            integer, which attempt of the intent
//	response_status    smallint, NULL while in progress
//	response_headers   jsonb, {"Header": ["value", ...]}
//	response_body      bytea
//	completed_at       timestamptz, the database's now() at completion
//	released_at        timestamptz, set by a release
//	reconcile_after    timestamptz, when the reconciler may try again
//
// A row is in progress (no answer yet), finished, or released (released_at
// set: nothing happened, and the next claim of the same request takes it
// over as the next attempt of the same intent); the status and
// completed_at are NULL together (the store's statements keep them so; the
// table has no CHECK constraints, which every write would pay for). Every
// timestamp comes from the database clock, never from the application's, so
// instances with skewed clocks agree.
//
// # Retention and takeover
//
// A key lives for its row's retention after its answer (completed_at) or its
// release (released_at); a row in progress never expires, however old, since
// its outcome is unknown. The row's retention is the Config.Retention (24h by
// default) of the Store that claimed it, raised to that of a Store that
// answers or releases it with a longer one: a fleet whose instances have
// different retentions keeps each key at least as long as every instance
// that took part in it promised. An expired row is invisible: [Store.Get]
// reports idem.ErrNotFound, and the next [Store.Claim] of its key takes the
// row over in place (new fingerprint, new intent, new owner, attempt 1, no
// answer, new created_at, the claiming Store's retention) as a new intent,
// whether or not a [Sweeper] has deleted it yet. Sweeping only reclaims
// space.
//
// # One round trip
//
// Each call is one SQL statement, so one round trip, and safe to run
// concurrently from any number of instances: Claim reads the key's row and,
// when there is none, decides the winner with INSERT ... ON CONFLICT DO
// NOTHING in the same statement, which returns the existing row to the
// losers. A lost claim (a replay, a retry in progress, a reused key) locks,
// writes and waits for nothing: it costs what a SELECT costs; Complete and
// Release are one guarded UPDATE. The exceptions, each documented on its
// method, are a Claim that finds an expired or released row (one more
// statement takes it over) or races with another claimer (one more
// statement), the failure paths of the guarded writes (one more statement
// to tell idem.ErrNotFound, idem.ErrNotOwner and idem.ErrCompleted apart),
// and, while a Store's claims rarely find their key's row, a Claim that
// inserts first: a new key's claim is then a plain insert, a cheaper
// statement, and a key that has a row costs the claim one more.
//
// # Durable answers, shared commits
//
// Both writes of a first execution, the claim and the answer, return once
// their commit is on disk, so every answer a client reads survives a
// PostgreSQL crash (Config.AsynchronousAnswers is the unsafe opt-out). Once
// the Store's statements queue, at the server or for a connection of its
// pool, the flushes are shared rather than waited for one by one: the claims
// (or answer writes) that would add to the queue wait for a statement of
// theirs in flight, then go together as one statement and one commit on the
// connection it gives back, each request getting its own key's result. The
// Store tells that its statements queue at the server from their latency
// against the least it has lately seen. Below that, every request goes at
// once, alone.
//
// # Transactions
//
// The Store runs its statements through a [DB], which *pgxpool.Pool and
// pgx.Tx both satisfy. [Store.WithDB] binds a copy of a Store to a caller's
// transaction, so that storing the answer commits or rolls back together with
// the caller's own writes. No call raises a unique violation, so a lost
// Claim or Complete leaves the transaction usable.
//
// # Errors
//
// Errors wrap the store errors of package idem ([idem.ErrNotFound],
// [idem.ErrNotOwner], [idem.ErrCompleted], [idem.ErrExists],
// [idem.ErrInvalid]) and keep the driver's error (a *pgconn.PgError, a
// context error) reachable: compare with errors.Is and errors.As.
package durable
