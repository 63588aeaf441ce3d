package tempserver

// Streaming replication: a standby of a Postgres, its promotion, and a crash
// of the primary that leaves none of its processes running.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// StartStandby creates a streaming standby of p and starts it: pg_basebackup
// -R -X stream (run as the server's user, into a temporary directory of its
// own) copies p's cluster and writes a primary_conninfo whose
// application_name is name, the name that p's synchronous_standby_names
// refers to. The standby is started on a free port of 127.0.0.1 with the
// same settings as p, and StartStandby returns once it streams from p
// (pg_stat_wal_receiver says "streaming"). It is stopped and deleted when tb
// ends.
//
// The copy includes p's postgresql.auto.conf: set synchronous_standby_names
// on p (ALTER SYSTEM) after StartStandby, or the promoted standby will wait
// for a standby of its own. pg_basebackup is looked for beside p's pg_ctl;
// without it tb is skipped, or fails under CI=true.
func (p *Postgres) StartStandby(tb testing.TB, name string) *Postgres {
	tb.Helper()
	bin := p.pgCtl
	if real, err := filepath.EvalSymlinks(bin); err == nil {
		bin = real
	}
	basebackup := filepath.Join(filepath.Dir(bin), "pg_basebackup")
	if !isExec(basebackup) {
		missing(tb, basebackup, "install PostgreSQL's server package, which has it beside pg_ctl")
	}
	dir, err := os.MkdirTemp("", "idem-pg-standby-")
	if err != nil {
		tb.Fatalf("tempserver: %v", err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := p.runAs.own(dir); err != nil {
		tb.Fatalf("tempserver: %v", err)
	}
	s := &Postgres{tb: tb, pgCtl: p.pgCtl, dir: dir, runAs: p.runAs}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=%s", p.port, name)
	if out, err := s.command(ctx, basebackup, "-D", s.data(), "-d", conninfo,
		"-R", "-X", "stream", "-c", "fast", "--no-sync").CombinedOutput(); err != nil {
		tb.Fatalf("tempserver: pg_basebackup: %v\n%s", err, out)
	}
	var last error
	for range 3 {
		if s.port, last = freePort(); last != nil {
			continue
		}
		if last = s.Start(); last == nil {
			break
		}
	}
	if last != nil {
		tb.Fatalf("tempserver: start the standby: %v", last)
	}
	tb.Cleanup(func() { _ = s.Stop("immediate") })
	err = waitFor(30*time.Second, func() error {
		var status string
		if err := s.queryRow(ctx, "SELECT coalesce((SELECT status FROM pg_stat_wal_receiver), 'none')", &status); err != nil {
			return err
		}
		if status != "streaming" {
			return fmt.Errorf("its WAL receiver is %q", status)
		}
		return nil
	})
	if err != nil {
		logTail, _ := readTail(filepath.Join(s.dir, "log"), 2000)
		tb.Fatalf("tempserver: the standby does not stream: %v\n%s", err, logTail)
	}
	return s
}

// Promote ends the recovery of a standby (pg_ctl promote) and returns once
// it accepts writes: the WAL it had received from its primary is replayed
// and its own. A recovery paused with pg_wal_replay_pause() ends too.
func (p *Postgres) Promote() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := p.command(ctx, p.pgCtl, "promote", "-D", p.data(), "-w", "-t", "60").CombinedOutput(); err != nil {
		return fmt.Errorf("tempserver: pg_ctl promote: %v\n%s", err, out)
	}
	return waitFor(30*time.Second, func() error {
		var recovering bool
		if err := p.queryRow(ctx, "SELECT pg_is_in_recovery()", &recovering); err != nil {
			return err
		}
		if recovering {
			return errors.New("tempserver: still in recovery after pg_ctl promote")
		}
		return nil
	})
}

// Kill ends the server as a crash of its host would, with no chance to
// write or send anything more: SIGKILL to the postmaster and every one of
// its processes (backends, WAL senders, the WAL writer) at once, and waits
// until none of them runs, so that no statement sent after Kill returns is
// served. Stop("immediate") differs: it asks (SIGQUIT), and the postmaster
// ends its children. Killing a stopped server does nothing. Kill needs
// Linux.
func (p *Postgres) Kill() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.online {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(p.data(), "postmaster.pid"))
	if err != nil {
		return fmt.Errorf("tempserver: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 1 {
		return fmt.Errorf("tempserver: postmaster.pid starts with %q", first)
	}
	if err := killTree(pid); err != nil {
		return fmt.Errorf("tempserver: %w", err)
	}
	p.online = false
	return nil
}

// queryRow runs sql on the server's postgres database on a connection of its
// own and scans its one row into dest.
func (p *Postgres) queryRow(ctx context.Context, sql string, dest ...any) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.URL())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql).Scan(dest...)
}
