// Package tempserver starts throwaway servers for fault-injection tests: a
// redis-server on a free port of 127.0.0.1, a Redis Cluster of six of them
// (three masters, three replicas), a PostgreSQL cluster created with
// initdb in a temporary directory and run with pg_ctl, and streaming
// standbys of it (pg_basebackup -R) to promote. Tests may kill and restart
// them at will; everything is stopped and deleted when the test ends.
//
// When a binary is missing the test is skipped, except under CI=true, where
// it fails: CI must never skip.
//
// PostgreSQL refuses to run as root. When the test runs as root, the cluster
// is created and run as the "postgres" user (the Debian packages create it).
package tempserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idem/internal/heavy"
)

// missing skips tb, or fails it under CI=true, because a binary is absent.
func missing(tb testing.TB, what, hint string) {
	tb.Helper()
	msg := fmt.Sprintf("tempserver: %s not found; %s", what, hint)
	if os.Getenv("CI") == "true" {
		tb.Fatal(msg)
	}
	tb.Skip(msg)
}

// freePort returns a port of 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// waitFor polls ready until it succeeds or d has passed.
func waitFor(d time.Duration, ready func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Redis is a redis-server process owned by a test.
type Redis struct {
	tb   testing.TB
	bin  string
	dir  string
	port int
	args []string // further arguments (a cluster node's)
	log  string   // the server's log file when it has one, else its output is kept

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	out  *bytes.Buffer
}

// StartRedis starts redis-server (found in PATH) on a free port of
// 127.0.0.1, without persistence, and stops it when tb ends.
func StartRedis(tb testing.TB) *Redis {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		missing(tb, "redis-server", "install it (apt-get install redis-server)")
	}
	r := &Redis{tb: tb, bin: bin, dir: tb.TempDir()}
	var last error
	for range 3 { // the free port may be taken between the probe and the start
		if r.port, last = freePort(); last != nil {
			continue
		}
		if last = r.Start(); last == nil {
			break
		}
	}
	if last != nil {
		tb.Fatalf("tempserver: start redis-server: %v", last)
	}
	tb.Cleanup(func() { _ = r.Kill() })
	return r
}

// Addr returns host:port of the server. It stays the same across Kill and
// Start.
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// Start starts the server again on the same port after Kill. It waits until
// it answers PING. Starting a running server is an error.
func (r *Redis) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		return errors.New("tempserver: redis-server already running")
	}
	out := &bytes.Buffer{}
	cmd := exec.Command(r.bin,
		"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir,
		"--daemonize", "no", "--loglevel", "warning")
	cmd.Args = append(cmd.Args, r.args...)
	if r.log != "" {
		cmd.Args = append(cmd.Args, "--logfile", r.log)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = childAttr(nil)
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	err := waitFor(5*time.Second, func() error {
		select {
		case <-done:
			return errors.New("exited")
		default:
		}
		return pingRedis(r.Addr())
	})
	if err != nil {
		_ = cmd.Process.Kill()
		<-done
		if r.log != "" {
			b, _ := readTail(r.log, 2000)
			out = bytes.NewBufferString(b)
		}
		return fmt.Errorf("redis-server on port %d: %w; output: %s", r.port, err, out.String())
	}
	r.cmd, r.done, r.out = cmd, done, out
	return nil
}

// Kill ends the server with SIGKILL, as a crash would, and waits for it to
// exit. Every key is lost. Killing a stopped server does nothing.
func (r *Redis) Kill() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return nil
	}
	err := r.cmd.Process.Kill()
	<-r.done
	r.cmd, r.done = nil, nil
	return err
}

func pingRedis(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	buf := make([]byte, 7)
	n, err := c.Read(buf)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(string(buf[:n]), "+PONG") {
		return fmt.Errorf("PING answered %q", buf[:n])
	}
	return nil
}

// Postgres is a PostgreSQL cluster in a temporary directory, owned by a test.
type Postgres struct {
	tb     testing.TB
	pgCtl  string
	dir    string // owned by the server's user; holds data/, the socket, the log
	port   int
	runAs  *account
	env    []string // more environment for the server (StartPostgresWithClock)
	mu     sync.Mutex
	online bool
}

// StartPostgres creates a cluster with initdb (trust authentication, user
// postgres, UTF8, no fsync: committed data survives a server crash, not a
// machine crash) in a temporary directory and starts it with
// pg_ctl on a free port of 127.0.0.1. The cluster is stopped and deleted when
// tb ends. The binaries are taken from PATH, else from the newest
// /usr/lib/postgresql/*/bin. It is a heavy test's (internal/heavy): tb is
// skipped unless those run.
func StartPostgres(tb testing.TB) *Postgres {
	tb.Helper()
	return startPostgres(tb, nil)
}

// libfaketime is the library StartPostgresWithClock preloads (Debian's
// faketime package).
const libfaketime = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"

// StartPostgresWithClock is StartPostgres with the server's wall clock under
// the test's control: the server runs under libfaketime, and step moves its
// clock to d away from the host's (now() and every timestamp the server
// takes; its monotonic clock is left alone), at once for every server
// process. Without libfaketime tb is skipped, or fails under CI=true.
func StartPostgresWithClock(tb testing.TB) (p *Postgres, step func(d time.Duration)) {
	tb.Helper()
	heavy.Gate(tb)
	if _, err := os.Stat(libfaketime); err != nil {
		missing(tb, libfaketime, "apt-get install faketime")
	}
	dir, err := os.MkdirTemp("", "idem-pg-clock-")
	if err != nil {
		tb.Fatalf("tempserver: %v", err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatalf("tempserver: %v", err)
	}
	file := filepath.Join(dir, "offset")
	step = func(d time.Duration) {
		tb.Helper()
		// Written whole, then renamed: a server process never reads half.
		tmp := file + ".new"
		if err := os.WriteFile(tmp, []byte(fmt.Sprintf("%+d\n", int64(d/time.Second))), 0o644); err != nil {
			tb.Fatalf("tempserver: %v", err)
		}
		if err := os.Rename(tmp, file); err != nil {
			tb.Fatalf("tempserver: %v", err)
		}
	}
	step(0)
	p = startPostgres(tb, []string{
		"LD_PRELOAD=" + libfaketime,
		"FAKETIME_TIMESTAMP_FILE=" + file,
		"FAKETIME_NO_CACHE=1",
		"FAKETIME_DONT_FAKE_MONOTONIC=1",
	})
	return p, step
}

func startPostgres(tb testing.TB, env []string) *Postgres {
	tb.Helper()
	heavy.Gate(tb)
	initdb, pgCtl := pgBinaries()
	if initdb == "" || pgCtl == "" {
		missing(tb, "initdb and pg_ctl", "install PostgreSQL (apt-get install postgresql)")
	}
	runAs, err := serverUser()
	if err != nil {
		missing(tb, "a non-root user to run PostgreSQL as", err.Error())
	}
	dir, err := os.MkdirTemp("", "idem-pg-")
	if err != nil {
		tb.Fatalf("tempserver: %v", err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := runAs.own(dir); err != nil {
		tb.Fatalf("tempserver: %v", err)
	}
	p := &Postgres{tb: tb, pgCtl: pgCtl, dir: dir, runAs: runAs}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := p.command(ctx, initdb, "-D", p.data(), "-U", "postgres", "--auth=trust",
		"--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions").CombinedOutput(); err != nil {
		tb.Fatalf("tempserver: initdb: %v\n%s", err, out)
	}
	p.env = env // the server's, not initdb's
	var last error
	for range 3 {
		if p.port, last = freePort(); last != nil {
			continue
		}
		if last = p.Start(); last == nil {
			break
		}
	}
	if last != nil {
		tb.Fatalf("tempserver: start PostgreSQL: %v", last)
	}
	tb.Cleanup(func() { _ = p.Stop("immediate") })
	return p
}

func (p *Postgres) data() string { return filepath.Join(p.dir, "data") }

// Addr returns host:port of the server; it stays the same across Stop and
// Start.
func (p *Postgres) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

// URL returns a connection string for the postgres database as user
// postgres.
func (p *Postgres) URL() string {
	return "postgres://postgres@" + p.Addr() + "/postgres?sslmode=disable"
}

// URLVia returns URL with the host and port replaced by addr, for example a
// faultproxy in front of the server.
func (p *Postgres) URLVia(addr string) string {
	return "postgres://postgres@" + addr + "/postgres?sslmode=disable"
}

// Start starts the stopped cluster with pg_ctl and waits until it accepts
// connections.
func (p *Postgres) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.online {
		return errors.New("tempserver: PostgreSQL already running")
	}
	opts := strings.Join([]string{
		"-p", strconv.Itoa(p.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=" + p.dir,
		"-c", "fsync=off", "-c", "full_page_writes=off",
		"-c", "max_connections=60", "-c", "shared_buffers=16MB",
	}, " ")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := p.command(ctx, p.pgCtl, "start", "-D", p.data(), "-w", "-t", "30",
		"-l", filepath.Join(p.dir, "log"), "-o", opts).CombinedOutput()
	if err != nil {
		logTail, _ := os.ReadFile(filepath.Join(p.dir, "log"))
		return fmt.Errorf("pg_ctl start: %v\n%s\n%s", err, out, tail(logTail, 2000))
	}
	p.online = true
	return nil
}

// Stop stops the cluster with pg_ctl stop -m mode: "immediate" is a crash
// (no checkpoint, open connections cut), "fast" a clean shutdown. Stopping a
// stopped cluster does nothing.
func (p *Postgres) Stop(mode string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.online {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := p.command(ctx, p.pgCtl, "stop", "-D", p.data(), "-m", mode, "-w", "-t", "30").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl stop: %v\n%s", err, out)
	}
	p.online = false
	return nil
}

func (p *Postgres) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = p.dir
	env := append([]string{"LC_ALL=C", "PATH=" + os.Getenv("PATH")}, p.env...)
	if p.runAs != nil && p.runAs.home != "" {
		env = append(env, "HOME="+p.runAs.home)
	}
	cmd.Env = env
	cmd.SysProcAttr = childAttr(p.runAs)
	return cmd
}

// pgBinaries finds initdb and pg_ctl.
func pgBinaries() (initdb, pgCtl string) {
	initdb, _ = exec.LookPath("initdb")
	pgCtl, _ = exec.LookPath("pg_ctl")
	if initdb != "" && pgCtl != "" {
		return initdb, pgCtl
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		i, c := filepath.Join(d, "initdb"), filepath.Join(d, "pg_ctl")
		if isExec(i) && isExec(c) {
			return i, c
		}
	}
	return "", ""
}

func version(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func isExec(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// readTail returns the last n bytes of the file at path.
func readTail(path string, n int) (string, error) {
	b, err := os.ReadFile(path)
	return string(tail(b, n)), err
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
