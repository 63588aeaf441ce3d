package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"os/exec"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

func TestFlagErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"-nope"}, "flag provided but not defined: -nope"},
		{"positional argument", []string{"extra"}, `unexpected argument "extra"`},
		{"strategy", []string{"-strategy", "magic"}, `-strategy must be "hybrid" or "table", not "magic"`},
		{"addr", []string{"-addr", "8080"}, `-addr "8080": want HOST:PORT`},
		{"database url", []string{"-database-url", "postgres://u:topsecret@[bad"}, "-database-url: cannot parse"},
		{"empty database url", []string{"-database-url", ""}, "-database-url is empty"},
		{"redis addr", []string{"-redis-addr", "localhost"}, `-redis-addr "localhost": want HOST:PORT or "embedded"`},
		{"work syntax", []string{"-work", "soon"}, `invalid value "soon" for flag -work`},
		{"negative work", []string{"-work", "-1s"}, "-work -1s must not be negative"},
		{"ttl", []string{"-ttl", "0s"}, "-ttl 0s must be at least 1s"},
		// Issue 20: a -ttl of 65s let a settled key expire before the
		// client that waited for it came back, and charged it again.
		{"ttl within the reconciler's reach", []string{"-ttl", "65s"}, "-ttl 1m5s must be longer than -reconcile-after 1m0s + -reconcile-every 10s"},
		{"ttl within a pending Retry-After", []string{"-ttl", "25s", "-reconcile-after", "10s", "-reconcile-every", "5s"},
			"-ttl 25s must be longer than the Retry-After of a pending key (30s)"},
		{"schema", []string{"-schema", "Bad-Name"}, `-schema "Bad-Name"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), tc.args, &stdout, &stderr)
			require.ErrorIs(t, err, errUsage)
			require.Equal(t, 2, exitCode(err, &stderr))
			require.Contains(t, stderr.String(), tc.want)
			require.NotContains(t, stderr.String(), "topsecret")
			require.Empty(t, stdout.String(), "nothing started")
		})
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"-h"}, &stdout, &stderr)
	require.ErrorIs(t, err, flag.ErrHelp)
	require.Equal(t, 0, exitCode(err, &stderr))
	require.Contains(t, stderr.String(), "-strategy")
}

// The real process exits with status 2 on a bad flag and 1 on a failure.
func TestExitStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-strategy", "magic"}, 2, "-strategy must be"},
		// Nothing listens on port 1: a start-up failure, not a usage error.
		{[]string{"-database-url", "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=2"}, 1, "unreachable"},
	} {
		cmd := exec.Command(os.Args[0], tc.args...)
		cmd.Env = append(os.Environ(), runMainEnv+"=1")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		require.True(t, errors.As(err, &exit), "want an exit status, got %v", err)
		require.Equal(t, tc.code, exit.ExitCode(), "stderr: %s", stderr.String())
		require.Contains(t, stderr.String(), tc.want)
	}
}

func TestDescribeDB(t *testing.T) {
	t.Parallel()
	for conn, want := range map[string]string{
		"postgres://alice:s3cret@db.example:6543/shop?sslmode=disable":     "postgres://alice@db.example:6543/shop",
		"host=db.example port=6543 user=alice password=s3cret dbname=shop": "postgres://alice@db.example:6543/shop",
	} {
		cfg, err := pgxpool.ParseConfig(conn)
		require.NoError(t, err)
		require.Equal(t, want, describeDB(cfg))
	}
}
