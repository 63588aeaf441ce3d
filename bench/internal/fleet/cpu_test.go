package fleet

import (
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRedisCPU(t *testing.T) {
	info := "# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:2.500000\r\nused_cpu_sys_children:9.0\r\n"
	require.InDelta(t, 3.75, redisCPU(info), 1e-9)
	require.Zero(t, redisCPU(""))
}

func TestProcCPU(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc is Linux's")
	}
	// Burn some CPU, so that this process has used more than a tick.
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
	}
	s, err := ProcessCPU(os.Getpid())
	require.NoError(t, err)
	require.Positive(t, s)
	busy, total, err := machineCPU()
	require.NoError(t, err)
	require.Positive(t, busy)
	require.Greater(t, total, busy)
}

func TestBetween(t *testing.T) {
	t0 := time.Now()
	before := Reading{at: t0, self: 1, workers: map[int]float64{10: 2, 11: 3}, postgres: map[int]float64{20: 1, 21: 5},
		redis: 4, busy: 100, total: 1000, known: true, redisRead: true}
	after := Reading{at: t0.Add(2 * time.Second), self: 2, workers: map[int]float64{10: 3, 11: 4}, postgres: map[int]float64{20: 2, 22: 1},
		redis: 5, busy: 300, total: 1400, known: true, redisRead: true}
	u := Between(before, after)
	require.InDelta(t, 0.5, u.Driver, 1e-9)
	require.InDelta(t, 1.0, u.Workers, 1e-9)  // (1 + 1) / 2 s
	require.InDelta(t, 1.0, u.Postgres, 1e-9) // pid 20: 1, pid 22 (new): 1, pid 21 (gone): not counted
	require.InDelta(t, 0.5, u.Redis, 1e-9)
	require.InDelta(t, float64(u.Cores)*0.5, u.Machine, 1e-9) // 200 of 400 ticks busy
	require.True(t, u.Known)
}
