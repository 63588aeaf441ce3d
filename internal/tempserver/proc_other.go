//go:build !linux

package tempserver

import (
	"errors"
	"os"
	"syscall"
)

type account struct{ home string }

func serverUser() (*account, error) {
	if os.Geteuid() == 0 {
		return nil, errors.New("running as root is only supported on Linux")
	}
	return nil, nil
}

func (u *account) own(string) error { return nil }

func childAttr(*account) *syscall.SysProcAttr { return nil }

func killTree(int) error {
	return errors.New("killing a postmaster and its processes is only supported on Linux")
}
