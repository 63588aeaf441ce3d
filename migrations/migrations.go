// Package migrations holds the SQL that creates idem's PostgreSQL table, as
// numbered golang-migrate files (NNNN_name.up.sql and NNNN_name.down.sql).
//
// The files can be applied as they are by golang-migrate or any tool that
// runs plain SQL; they then create the table idempotency_keys in the current
// schema. durable.Migrate applies them itself, in one locked transaction, for
// the schema and table name of a durable.Config: every object name in the
// files is idempotency_keys or starts with idempotency_keys_, so the runner can
// rename them.
package migrations

import "embed"

// FS holds the migration files, at the root of the file system.
//
//go:embed *.sql
var FS embed.FS
