package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/internal/faultproxy"
	"github.com/idemguard/idem/internal/testdb"
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
		// The retention must outlast the reconciler's reach, or a settled
		// key could expire before a client that waited for it returns, and
		// that client's retry would charge again.
		{"ttl within the reconciler's reach", []string{"-ttl", "65s"}, "-ttl 1m5s must be longer than -reconcile-after 1m0s + -reconcile-every 10s"},
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

// unreachableDB is a database URL nothing answers: port 1 of 127.0.0.1.
const unreachableDB = "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=2"

// The real process exits with status 2 on a bad command line, whether or
// not PostgreSQL is reachable, and 1 on a failure to start (the port is
// taken).
func TestExitStatus(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { taken.Close() })
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-strategy", "magic"}, 2, "-strategy must be"},
		{[]string{"-strategy", "magic", "-database-url", unreachableDB}, 2, "-strategy must be"},
		// Refused by the guard's configuration, before PostgreSQL is asked.
		{[]string{"-strategy", "table", "-ttl", "10s", "-database-url", unreachableDB}, 2, "-ttl 10s must be longer"},
		{[]string{"-strategy", "table", "-addr", taken.Addr().String(), "-database-url", unreachableDB}, 1, "address already in use"},
	} {
		cmd := exec.Command(os.Args[0], tc.args...)
		cmd.Env = append(os.Environ(), runMainEnv+"=1")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		require.True(t, errors.As(err, &exit), "%q: want an exit status, got %v", tc.args, err)
		require.Equal(t, tc.code, exit.ExitCode(), "%q: stderr: %s", tc.args, stderr.String())
		require.Contains(t, strings.ToLower(stderr.String()), tc.want, "%q", tc.args)
	}
}

// Started while PostgreSQL is down, the service listens, answers 503 with
// Retry-After and reports not ready; as soon as PostgreSQL is back it
// migrates and serves, without a restart.
func TestStartWithoutPostgres(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testDatabaseURL(t))
	require.NoError(t, err)
	proxy := faultproxy.Start(t, u.Host)
	proxy.Refuse()
	u.Host = proxy.Addr()
	schema := testdb.Schema(t, testdb.Pool(t))

	a := startRaw(t, "-addr", "127.0.0.1:0", "-database-url", u.String(), "-schema", schema,
		"-strategy", "table", "-work", "20ms", "-reconcile-every", "50ms")
	require.Contains(t, a.log.String(), "database not ready")
	body := `{"hold_ids":[7],"payment_method":"pm_card"}`
	key := newKey()
	for range 2 {
		r := a.postOrder(t, "user-1", key, body)
		require.Equal(t, http.StatusServiceUnavailable, r.Status, "%s", r.Body)
		require.Contains(t, []string{"2", "3"}, r.Header.Get("Retry-After"))
		require.Equal(t, problemBase+"service-unavailable", r.problemType(t))
		require.Equal(t, http.StatusServiceUnavailable, a.do(t, http.MethodGet, "/readyz", "", "", "").Status)
	}

	require.NoError(t, proxy.Resume())
	require.Eventually(t, func() bool {
		r, err := a.call(http.MethodGet, "/readyz", "", "", "")
		return err == nil && r.Status == http.StatusOK
	}, 20*time.Second, 20*time.Millisecond, "ready once PostgreSQL is back")
	first := a.postOrder(t, "user-1", key, body)
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	retry := a.postOrder(t, "user-1", key, body)
	require.Equal(t, http.StatusCreated, retry.Status)
	require.True(t, retry.replayed())
	require.Equal(t, first.Body, retry.Body)
	require.Equal(t, 1, a.charges(t))
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

// The real process, started with nothing on PostgreSQL's port, stays up:
// it answers 503 with Retry-After and reports not ready.
func TestProcessStartsWithoutPostgres(t *testing.T) {
	t.Parallel()
	p := startProc(t, "no-postgres", "-addr", "127.0.0.1:0", "-strategy", "table", "-database-url", unreachableDB)
	r := p.postOrder(t, "user-1", newKey(), `{"hold_ids":[7],"payment_method":"pm_card"}`)
	require.Equal(t, http.StatusServiceUnavailable, r.Status, "%s", r.Body)
	require.Contains(t, []string{"2", "3"}, r.Header.Get("Retry-After"))
	require.Equal(t, http.StatusServiceUnavailable, p.do(t, http.MethodGet, "/readyz", "", "", "").Status)
	select {
	case <-p.done:
		t.Fatalf("the process exited: %v", p.err)
	default:
	}
}
