package fleet

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// Usage is the CPU each part of the system used between two readings, in
// cores (CPU seconds per second): 1.0 is one core busy all along.
// It is read from Linux's /proc and Redis' INFO cpu; elsewhere only Redis'
// figure is known (Known false).
type Usage struct {
	// Driver is the bench process: the load driver and, in the crossover,
	// the guard.
	Driver float64
	// Workers is the sum over the worker processes.
	Workers float64
	// Postgres is the sum over the server's processes that work for the
	// fleet: the backends of the workers' connections and the server's
	// background processes (WAL writer, checkpointer, background writer,
	// autovacuum), as listed by pg_stat_activity and read from /proc. The
	// backends of other clients of the same server are left out.
	Postgres float64
	// Redis is the Redis server's own figure (INFO cpu: used_cpu_user +
	// used_cpu_sys), whichever machine it runs on.
	Redis float64
	// Machine is every CPU of the machine busy (not idle, not waiting for
	// I/O), from /proc/stat; Cores is how many there are.
	Machine float64
	Cores   int
	// Known is false when /proc could not be read (not Linux): only Redis
	// is then filled in.
	Known bool
}

// clockTick is USER_HZ, the unit of /proc's CPU times: 100 on every Linux
// architecture Go supports.
const clockTick = 100

// Meter reads the CPU counters of a fleet, the PostgreSQL processes that
// serve it, Redis and the machine.
type Meter struct {
	redis *redis.Client
	pg    *pgxpool.Pool
	app   string
}

// NewMeter returns a meter that asks the Redis server at redisAddr for its
// CPU, and pg's server which of its processes serve the fleet whose
// workers connect as application app (Config.Schema). Close it after use.
func NewMeter(redisAddr string, pg *pgxpool.Pool, app string) *Meter {
	return &Meter{redis: redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 1}), pg: pg, app: app}
}

// Close closes the meter's Redis connection.
func (m *Meter) Close() error { return m.redis.Close() }

// Reading is a snapshot of the counters; Usage compares two.
type Reading struct {
	at               time.Time
	self             float64         // seconds
	workers          map[int]float64 // by pid, seconds
	postgres         map[int]float64 // by pid, seconds
	redis            float64         // seconds
	busy, total      float64         // /proc/stat ticks, all CPUs
	known, redisRead bool
}

// At is when the reading was taken.
func (r Reading) At() time.Time { return r.at }

// Read takes a snapshot of the CPU time used so far by this process, the
// workers of f, the postgres processes that serve them, Redis and the
// machine.
func (m *Meter) Read(ctx context.Context, f *Fleet) Reading {
	r := Reading{at: time.Now(), workers: map[int]float64{}, postgres: map[int]float64{}}
	if secs, err := RedisCPU(ctx, m.redis); err == nil {
		r.redis, r.redisRead = secs, true
	}
	if runtime.GOOS != "linux" {
		return r
	}
	self, err := ProcessCPU(os.Getpid())
	if err != nil {
		return r
	}
	r.self = self
	for _, pid := range f.PIDs() {
		if s, err := ProcessCPU(pid); err == nil {
			r.workers[pid] = s
		}
	}
	rows, err := m.pg.Query(ctx, `SELECT pid FROM pg_stat_activity
	WHERE application_name = $1 OR backend_type <> 'client backend'`, m.app)
	if err == nil {
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err == nil {
			for _, pid := range pids {
				if s, err := ProcessCPU(int(pid)); err == nil {
					r.postgres[int(pid)] = s
				}
			}
		}
	}
	r.busy, r.total, err = machineCPU()
	r.known = err == nil
	return r
}

// Between returns the CPU used between the readings before and after. A
// process that started in between counts from its start; one that exited
// in between is not counted.
func Between(before, after Reading) Usage {
	secs := after.at.Sub(before.at).Seconds()
	u := Usage{Cores: runtime.NumCPU(), Known: before.known && after.known}
	if secs <= 0 {
		return u
	}
	if before.redisRead && after.redisRead {
		u.Redis = (after.redis - before.redis) / secs
	}
	if !u.Known {
		return u
	}
	u.Driver = (after.self - before.self) / secs
	u.Workers = sumDelta(before.workers, after.workers) / secs
	u.Postgres = sumDelta(before.postgres, after.postgres) / secs
	if dt := after.total - before.total; dt > 0 {
		u.Machine = float64(u.Cores) * (after.busy - before.busy) / dt
	}
	return u
}

func sumDelta(before, after map[int]float64) float64 {
	var s float64
	for pid, v := range after {
		s += v - before[pid]
	}
	return s
}

// ProcessCPU returns the user + system CPU seconds process pid has used,
// from /proc/<pid>/stat (Linux only).
func ProcessCPU(pid int) (float64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// the fields after the last ')' start with field 3 (state).
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, strconv.ErrSyntax
	}
	utime, err1 := strconv.ParseFloat(f[11], 64) // field 14
	stime, err2 := strconv.ParseFloat(f[12], 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, strconv.ErrSyntax
	}
	return (utime + stime) / clockTick, nil
}

// machineCPU returns the busy and total ticks of all CPUs from /proc/stat:
// busy is everything but idle and iowait (steal counts as busy: the
// hypervisor gave that time to another machine).
func machineCPU() (busy, total float64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, strconv.ErrSyntax
	}
	// user nice system idle iowait irq softirq steal (guest time is
	// already in user).
	for i, v := range f[1:min(len(f), 9)] {
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, 0, err
		}
		total += x
		if i != 3 && i != 4 {
			busy += x
		}
	}
	return busy, total, nil
}

// RedisCPU returns the CPU seconds, user and system, that the Redis server
// behind c has used (INFO cpu).
func RedisCPU(ctx context.Context, c redis.UniversalClient) (float64, error) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	return redisCPU(info), nil
}

// redisCPU returns used_cpu_user + used_cpu_sys from an INFO cpu reply.
func redisCPU(info string) float64 {
	var s float64
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			if x, err := strconv.ParseFloat(v, 64); err == nil {
				s += x
			}
		}
	}
	return s
}
