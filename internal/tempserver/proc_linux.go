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

// killTree sends SIGKILL to the process pid (a postmaster) and to every
// process it started, and waits until none of them runs any more. They are
// found by their parent, not by a process group: each child of a postmaster
// leads a session of its own (setsid), so the postmaster's group holds it
// alone, and killing that group left its backends serving for a moment (a
// statement sent right after the kill could still commit). The postmaster
// is stopped first, so that it starts no child between the listing and the
// kill. A zombie (killed, not yet reaped: a postmaster's orphans are
// reparented to PID 1, which may never reap them) no longer runs, so it does
// not count.
func killTree(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("stop process %d: %w", pid, err)
	}
	tree := []int{pid}
	for p, st := range processes() {
		if st.ppid == pid {
			tree = append(tree, p)
		}
	}
	for _, p := range tree {
		_ = syscall.Kill(p, syscall.SIGKILL) // one that exited meanwhile is gone already
	}
	return waitFor(10*time.Second, func() error {
		all := processes()
		n := 0
		for _, p := range tree {
			if st, ok := all[p]; ok && st.running {
				n++
			}
		}
		if n > 0 {
			return fmt.Errorf("%d of the %d processes of postmaster %d still run", n, len(tree), pid)
		}
		return nil
	})
}

// procStat is what killTree reads of a process.
type procStat struct {
	ppid    int
	running bool // neither a zombie nor dead
}

// processes reads every process's parent and state from /proc/<pid>/stat
// (field 3 is the state, field 4 the parent).
func processes() map[int]procStat {
	entries, _ := os.ReadDir("/proc")
	out := make(map[int]procStat, len(entries))
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
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
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		out[pid] = procStat{ppid: ppid, running: f[0] != "Z" && f[0] != "X"}
	}
	return out
}
