//go:build unix

package delayproxy

import (
	"syscall"
	"time"
)

// raisePriority asks the kernel to schedule the proxy ahead of ordinary
// processes (nice -10), so that on a busy machine its delays are the ones
// asked for, not the run queue's wait. It needs the privilege to lower a
// nice value; without it the proxy runs at the default priority, and the
// report's measured round trip shows what the distance really was.
func raisePriority(pid int) error {
	return syscall.Setpriority(syscall.PRIO_PROCESS, pid, -10)
}

// sleep waits d with the kernel's high-resolution timer. time.Sleep does not
// do for sub-millisecond delays: an idle Go process waits for its timers in
// epoll with millisecond precision, which turned +0.5 ms round trips into
// +2.5 ms. The goroutine blocks its thread in nanosleep; the runtime starts
// others as needed.
func sleep(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	for {
		var rem syscall.Timespec
		err := syscall.Nanosleep(&ts, &rem)
		if err != syscall.EINTR {
			return
		}
		ts = rem
	}
}
