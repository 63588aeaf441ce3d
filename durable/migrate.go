package durable

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemguard/idem/migrations"
)

// versionTable records, per table name, the migration versions applied in
// its schema.
const versionTable = "idem_migrations"

const createVersionTable = `
CREATE TABLE ` + versionTable + ` (
	table_name text        NOT NULL,
	version    bigint      NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (table_name, version)
)`

// Migrate brings the table of cfg (a nil cfg gives the defaults) up to date
// with the migrations embedded in package migrations. It is a no-op when the
// table is up to date, and fails, changing nothing, when the table has a
// migration this build does not have: a newer build migrated it, and this
// one must not serve it (see [Store]).
//
// Everything happens in one transaction of db, so a failed migration leaves
// nothing behind. It first takes a transaction-scoped advisory lock derived
// from the schema and table, so that several instances may call Migrate at
// once at start-up: one applies the migrations, the others wait and find
// nothing to do. It then creates the schema if one is set and absent, and
// the version table idem_migrations in that schema if absent, and applies
// each unapplied NNNN_*.up.sql file in version order with the object names
// renamed after cfg.Table, recording each version. With cfg.Partitions set,
// the table is created hash-partitioned on user_id into that many
// partitions. Last, it checks that the table's layout (plain, or its number
// of partitions) is the one cfg asks for, and fails otherwise: an existing
// table is never re-laid out.
//
// When db is a pgx.Tx, Migrate runs in a savepoint of it and leaves its
// search_path as it found it.
//
// When db is a *pgxpool.Pool whose connections cache prepared statements
// (pgx's default, default_query_exec_mode=cache_statement), Migrate then
// checks that they survive from one transaction to the next, and fails,
// saying how to connect, when they do not: behind a pooler in transaction
// mode that does not track them (PgBouncer before 1.21), statements would
// fail at random with SQLSTATE 26000 or 42P05, and an answer write that
// fails on every try leaves its key in progress until reconciled.
func Migrate(ctx context.Context, db Beginner, cfg *Config) error {
	if err := migrate(ctx, db, cfg, false, 0); err != nil {
		return err
	}
	if pool, ok := db.(*pgxpool.Pool); ok {
		return checkStatements(ctx, pool)
	}
	return nil
}

// MigrateDown undoes the migrations applied to the table of cfg (a nil cfg
// gives the defaults): it applies their NNNN_*.down.sql files in reverse
// version order, which drops the table, and deletes their version rows. It
// leaves the schema and the idem_migrations table in place, and is a no-op
// when nothing is applied. Like [Migrate] it runs in one transaction under
// the same advisory lock.
//
// WARNING: it deletes every stored key and answer of the table.
func MigrateDown(ctx context.Context, db Beginner, cfg *Config) error {
	return migrate(ctx, db, cfg, true, 0)
}

// migrate applies the unapplied migrations or, with down, undoes the applied
// versions above to (0: all of them).
func migrate(ctx context.Context, db Beginner, cfg *Config, down bool, to int64) (err error) {
	op := "migrate"
	if down {
		op = "migrate down"
	}
	if db == nil {
		return errNilDB
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	files, err := loadMigrations(migrations.FS)
	if err != nil {
		return &opError{op: op, err: err}
	}

	// Errors are wrapped but not translated: a unique violation here is
	// not the Store's idem.ErrExists.
	tx, err := db.Begin(ctx)
	if err != nil {
		return &opError{op: op, err: err}
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if err := runMigrations(ctx, tx, &c, files, down, to); err != nil {
		e := &opError{op: op, err: err}
		if statementLost(err) {
			e.kind = errStatementCache
		}
		return e
	}
	if err := tx.Commit(ctx); err != nil {
		return &opError{op: op, err: err}
	}
	return nil
}

func runMigrations(ctx context.Context, tx pgx.Tx, c *Config, files []migration, down bool, to int64) (err error) {
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockKey(c)); err != nil {
		return fmt.Errorf("advisory lock: %w", err)
	}

	if c.Schema != "" {
		schema := pgx.Identifier{c.Schema}.Sanitize()
		if !down {
			var exists bool
			err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", c.Schema).Scan(&exists)
			if err == nil && !exists {
				err = create(ctx, tx, "CREATE SCHEMA "+schema)
			}
			if err != nil {
				return fmt.Errorf("create schema: %w", err)
			}
		}
		// Unqualified names in the migration files resolve to the schema.
		// The setting is restored before commit so that a caller's
		// transaction (db may be a pgx.Tx) keeps its own.
		var saved string
		err := tx.QueryRow(ctx, "SELECT current_setting('search_path')").Scan(&saved)
		if err == nil {
			_, err = tx.Exec(ctx, "SELECT set_config('search_path', $1, true)", schema)
		}
		if err != nil {
			return fmt.Errorf("search_path: %w", err)
		}
		defer func() {
			if err == nil {
				_, err = tx.Exec(ctx, "SELECT set_config('search_path', $1, true)", saved)
			}
		}()
	}

	var exists bool
	if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", versionTable).Scan(&exists); err != nil {
		return fmt.Errorf("version table: %w", err)
	}
	if !exists {
		if down {
			return nil
		}
		if err := create(ctx, tx, createVersionTable); err != nil {
			return fmt.Errorf("version table: %w", err)
		}
	}

	rows, err := tx.Query(ctx, "SELECT version FROM "+versionTable+" WHERE table_name = $1", table)
	if err != nil {
		return fmt.Errorf("read versions: %w", err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return fmt.Errorf("read versions: %w", err)
	}

	if down {
		slices.SortFunc(applied, func(a, b int64) int { return cmp.Compare(b, a) })
		for _, v := range applied {
			if v <= to {
				break
			}
			i := slices.IndexFunc(files, func(m migration) bool { return m.version == v })
			if i < 0 {
				return fmt.Errorf("version %d is applied but has no migration file", v)
			}
			if _, err := tx.Exec(ctx, files[i].down); err != nil {
				return fmt.Errorf("%s: %w", files[i].downName, err)
			}
			if _, err := tx.Exec(ctx, "DELETE FROM "+versionTable+" WHERE table_name = $1 AND version = $2", table, v); err != nil {
				return fmt.Errorf("%s: %w", files[i].downName, err)
			}
		}
		return nil
	}

	for _, v := range applied {
		if !slices.ContainsFunc(files, func(m migration) bool { return m.version == v }) {
			return fmt.Errorf("%w: version %d is applied to %s and this build has no such migration (it serves version %d): deploy a build that has it",
				errSchemaNewer, v, c.qualified(), files[len(files)-1].version)
		}
	}
	for _, m := range files {
		if slices.Contains(applied, m.version) {
			continue
		}
		sql := m.up
		if m.version == 1 && c.Partitions > 0 {
			if sql, err = partitioned(sql, table, c.Partitions); err != nil {
				return fmt.Errorf("%s: %w", m.upName, err)
			}
		}
		if _, err := tx.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", m.upName, err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+versionTable+" (table_name, version) VALUES ($1, $2)", table, m.version); err != nil {
			return fmt.Errorf("%s: %w", m.upName, err)
		}
	}
	return checkLayout(ctx, tx, c)
}

// partitioned rewrites the CREATE TABLE of migration 1 (renamed for
// table) so that it creates the table hash-partitioned on user_id, followed
// by its n partitions.
func partitioned(sql, table string, n int) (string, error) {
	head := "CREATE TABLE " + table + " ("
	i := strings.Index(sql, head)
	if i < 0 {
		return "", fmt.Errorf("no %q to partition", head)
	}
	end := strings.Index(sql[i:], "\n);")
	if end < 0 {
		return "", fmt.Errorf("%q does not end with a line \");\"", head)
	}
	end += i
	var b strings.Builder
	b.WriteString(sql[:end])
	b.WriteString("\n) PARTITION BY HASH (user_id);\n")
	for p := range n {
		fmt.Fprintf(&b, "CREATE TABLE %s_p%d PARTITION OF %s FOR VALUES WITH (MODULUS %d, REMAINDER %d);\n", table, p, table, n, p)
	}
	b.WriteString(sql[end+len("\n);"):])
	return b.String(), nil
}

// checkLayout reports an error when the table is not laid out as c asks:
// plain when c.Partitions is 0, else hash-partitioned into c.Partitions.
func checkLayout(ctx context.Context, tx pgx.Tx, c *Config) error {
	var kind string
	var parts int
	err := tx.QueryRow(ctx, `
SELECT c.relkind::text, (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = c.oid)
FROM pg_class c WHERE c.oid = to_regclass($1)`, c.qualified()).Scan(&kind, &parts)
	if err != nil {
		return fmt.Errorf("read the layout of %s: %w", c.qualified(), err)
	}
	switch {
	case c.Partitions == 0 && kind == "p":
		return fmt.Errorf("%s is partitioned into %d but Config.Partitions is 0; changing the layout needs the rows moved (docs/scaling.md)", c.qualified(), parts)
	case c.Partitions > 0 && kind != "p":
		return fmt.Errorf("%s is not partitioned but Config.Partitions is %d; changing the layout needs the rows moved (docs/scaling.md)", c.qualified(), c.Partitions)
	case c.Partitions > 0 && parts != c.Partitions:
		return fmt.Errorf("%s has %d partitions but Config.Partitions is %d; changing the layout needs the rows moved (docs/scaling.md)", c.qualified(), parts, c.Partitions)
	}
	return nil
}

// create runs a CREATE statement for an object found absent. The advisory
// lock of Migrate is per table, so Migrate calls for two tables of one schema
// may race to create the schema or the version table: the statement runs in a
// savepoint, and the loser's duplicate error is ignored.
func create(ctx context.Context, tx pgx.Tx, sql string) error {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := sp.Exec(ctx, sql); err != nil {
		_ = sp.Rollback(ctx)
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
			switch pgErr.Code {
			case "23505", "42P06", "42P07": // unique violation, duplicate schema, duplicate table
				return nil
			}
		}
		return err
	}
	return sp.Commit(ctx)
}

// lockKey derives the advisory lock key of Migrate from the schema and table.
func lockKey(c *Config) int64 {
	h := fnv.New64a()
	h.Write([]byte("idem/durable.Migrate\x00" + c.Schema + "\x00" + table))
	return int64(h.Sum64())
}

// migration is one version: its up and down SQL.
type migration struct {
	version          int64
	upName, downName string
	up, down         string
}

var migrationFileRE = regexp.MustCompile(`^(\d+)_[a-z0-9_]+\.(up|down)\.sql$`)

// loadMigrations reads the migration files at the root of fsys, in version
// order. Every version must have both an up and a down file.
func loadMigrations(fsys fs.FS) ([]migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, err
	}
	byVersion := make(map[int64]*migration)
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".sql") {
			continue
		}
		parts := migrationFileRE.FindStringSubmatch(name)
		if parts == nil {
			return nil, fmt.Errorf("migration file %s: name is not NNNN_name.up.sql or NNNN_name.down.sql", name)
		}
		version, err := strconv.ParseInt(parts[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("migration file %s: %w", name, err)
		}
		text, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		m := byVersion[version]
		if m == nil {
			m = &migration{version: version}
			byVersion[version] = m
		}
		if parts[2] == "up" {
			if m.upName != "" {
				return nil, fmt.Errorf("migration files %s and %s have the same version", m.upName, name)
			}
			m.upName, m.up = name, string(text)
		} else {
			if m.downName != "" {
				return nil, fmt.Errorf("migration files %s and %s have the same version", m.downName, name)
			}
			m.downName, m.down = name, string(text)
		}
	}
	files := make([]migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.upName == "" || m.downName == "" {
			return nil, fmt.Errorf("migration version %d needs both an up and a down file", m.version)
		}
		files = append(files, *m)
	}
	slices.SortFunc(files, func(a, b migration) int { return cmp.Compare(a.version, b.version) })
	return files, nil
}
