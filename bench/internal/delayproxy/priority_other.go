//go:build !unix

package delayproxy

import "time"

func raisePriority(int) error { return nil }

func sleep(d time.Duration) { time.Sleep(d) }
