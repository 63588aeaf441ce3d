package durable

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/migrations"
)

func TestTranslate(t *testing.T) {
	pgErr := func(code string) error {
		return fmt.Errorf("pgx wrapping: %w", &pgconn.PgError{Severity: "ERROR", Code: code, Message: "m"})
	}
	tests := []struct {
		name  string
		err   error
		kind  error // sentinel it must wrap, nil for none
		cause error // an error that must stay reachable
		text  string
	}{
		{name: "no rows", err: pgx.ErrNoRows, kind: idem.ErrNotFound, text: "idem: not found"},
		{name: "invalid byte sequence", err: pgErr("22021"), kind: idem.ErrInvalid, text: "durable: op: invalid argument: pgx wrapping: ERROR: m (SQLSTATE 22021)"},
		{name: "unsupported unicode escape", err: pgErr("22P05"), kind: idem.ErrInvalid},
		{name: "numeric out of range", err: pgErr("22003"), kind: idem.ErrInvalid},
		{name: "check violation", err: pgErr("23514"), kind: idem.ErrInvalid},
		{name: "unique violation", err: pgErr("23505"), kind: idem.ErrExists},
		{name: "not null violation", err: pgErr("23502")},
		{name: "undefined table", err: pgErr("42P01"), text: "durable: op: the schema lacks a table or column of this build: run durable.Migrate: pgx wrapping: ERROR: m (SQLSTATE 42P01)"},
		{name: "undefined column", err: pgErr("42703"), text: "durable: op: the schema lacks a table or column of this build: run durable.Migrate: pgx wrapping: ERROR: m (SQLSTATE 42703)"},
		{name: "deadline", err: fmt.Errorf("timeout: %w", context.DeadlineExceeded), cause: context.DeadlineExceeded, text: "durable: op: timeout: context deadline exceeded"},
	}
	sentinels := []error{idem.ErrNotFound, idem.ErrInvalid, idem.ErrExists, idem.ErrNotOwner, idem.ErrCompleted}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := translate("op", tt.err)
			for _, s := range sentinels {
				require.Equal(t, s == tt.kind, errors.Is(got, s), "errors.Is(%v)", s)
			}
			if tt.cause != nil {
				require.ErrorIs(t, got, tt.cause)
			}
			if _, ok := errors.AsType[*pgconn.PgError](tt.err); ok {
				require.ErrorAs(t, got, new(*pgconn.PgError))
			}
			if tt.text != "" {
				require.EqualError(t, got, tt.text)
			}
		})
	}
	require.NoError(t, translate("op", nil))
}

func TestLoadMigrations(t *testing.T) {
	files, err := loadMigrations(migrations.FS)
	require.NoError(t, err)
	require.NotEmpty(t, files)
	// Applied versions are tracked as a set (idem_migrations), so a gap is
	// harmless: each missing version is applied when its file arrives.
	require.EqualValues(t, 1, files[0].version, "versions start at 1")
	for i := 1; i < len(files); i++ {
		require.Greater(t, files[i].version, files[i-1].version, "versions increase")
	}

	bad := map[string]fstest.MapFS{
		"no down":      {"0001_a.up.sql": {}},
		"bad name":     {"0001-a.up.sql": {}},
		"same version": {"0001_a.up.sql": {}, "0001_b.up.sql": {}, "0001_a.down.sql": {}},
	}
	for name, fsys := range bad {
		_, err := loadMigrations(fsys)
		require.Error(t, err, name)
	}
}

// TestMigrationNames checks what the Store relies on: every object name in
// the files is the table's or starts with it, and fits PostgreSQL's 63-byte
// limit, the partitions' (_p1023) included.
func TestMigrationNames(t *testing.T) {
	files, err := loadMigrations(migrations.FS)
	require.NoError(t, err)
	nameRE := regexp.MustCompile(table + `\w*`)
	for _, m := range files {
		for _, sql := range []string{m.up, m.down} {
			for _, name := range nameRE.FindAllString(sql, -1) {
				require.LessOrEqual(t, len(name), 63, name)
			}
		}
	}
	require.LessOrEqual(t, len(table+"_p1023"), 63)
}

func TestLockKey(t *testing.T) {
	a := lockKey(&Config{Schema: "a"})
	require.Equal(t, a, lockKey(&Config{Schema: "a"}))
	require.NotEqual(t, a, lockKey(&Config{Schema: "b"}))
	require.NotEqual(t, a, lockKey(&Config{}))
}

// TestKeyTagIsKeyHash: a notification names its key by the module's one hash
// of (scope, key), the key_hash of the log lines.
func TestKeyTagIsKeyHash(t *testing.T) {
	require.Equal(t, idem.KeyHash("user-1", "key-1"), keyTag("user-1", "key-1"))
	require.NotEqual(t, keyTag("user-1", "key-1"), keyTag("user-1k", "ey-1"))
}

// TestOneLine: a driver's message over several lines (pgx lists each
// address it failed to connect to) reads as one line in the store's error.
func TestOneLine(t *testing.T) {
	require.Equal(t, "plain", oneLine("plain"))
	require.Equal(t, "failed to connect to `user=postgres`: a: dial error; b: dial error",
		oneLine("failed to connect to `user=postgres`:\n\ta: dial error\n\tb: dial error"))
	err := &opError{op: "claim", err: errors.New("x:\n\ty\n\tz")}
	require.Equal(t, "durable: claim: x: y; z", err.Error())
}
