package tempserver

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// account is the account a server runs as when the test runs as root.
type account struct {
	uid, gid uint32
	home     string
}

// serverUser returns nil when the test does not run as root (the server runs
// as the test's own user), else the "postgres" account.
func serverUser() (*account, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root and there is no postgres user to run PostgreSQL as: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return &account{uid: uint32(uid), gid: uint32(gid), home: u.HomeDir}, nil
}

// own gives dir to u (nothing to do when u is nil).
func (u *account) own(dir string) error {
	if u == nil {
		return nil
	}
	return os.Chown(dir, int(u.uid), int(u.gid))
}

// childAttr runs a child as u (when not nil). A child run as the test's own
// user is killed if the test process dies, so that no server outlives it.
func childAttr(u *account) *syscall.SysProcAttr {
	if u == nil {
		return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	return &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.uid, Gid: u.gid}}
}

// killGroup sends SIGKILL to every process of the process group pgid at
// once and waits until none of them runs any more. A zombie (killed, not yet
// reaped: a postmaster's orphans are reparented to PID 1, which may never
// reap them) no longer runs, so it does not count.
func killGroup(pgid int) error {
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill process group %d: %w", pgid, err)
	}
	return waitFor(10*time.Second, func() error {
		if n := groupRunning(pgid); n > 0 {
			return fmt.Errorf("%d processes of group %d still run", n, pgid)
		}
		return nil
	})
}

// groupRunning counts the processes of group pgid that are not zombies, from
// /proc/<pid>/stat (field 3 is the state, field 5 the process group).
func groupRunning(pgid int) int {
	entries, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		// The command name (field 2) is in parentheses and may hold spaces.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if g, _ := strconv.Atoi(f[2]); g == pgid {
			n++
		}
	}
	return n
}
