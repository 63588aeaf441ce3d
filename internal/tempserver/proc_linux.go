package tempserver

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"syscall"
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
