// Package target sets up what the capacity planner drives: the real
// idem.Guard under each strategy; the ceiling, the same SQL statements and
// Redis commands issued directly through pgx and go-redis; and the minimal
// target, the least SQL that does the same job on the least schema; on a
// schema and a Redis key prefix of their own. It also reads the server-side counters
// (pg_stat_user_tables, WAL position, Redis INFO commandstats) that turn a
// step into writes and commands per request.
package target

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idem/bench/internal/fixture"
	"github.com/idemguard/idem/durable"
)

// Tables of the bench schema: the guard's, the ceiling's (both migrated with
// durable.Migrate) and the minimal one, so that the per-table statistics of
// one never include another's writes.
const (
	GuardTable   = "guard_keys"
	CeilingTable = "ceiling_keys"
	MinimalTable = "minimal_keys"
)

// Config says where the servers are and how big the client pools are.
type Config struct {
	DatabaseURL string
	RedisAddr   string
	// PoolSize is the pgx pool's MaxConns.
	PoolSize int
	// RedisPoolSize is go-redis' PoolSize; 0 keeps its default
	// (10 per GOMAXPROCS).
	RedisPoolSize int
}

// Env is a bench schema and Redis prefix with the clients that use them.
// Close drops the schema and deletes the keys.
type Env struct {
	Pool   *pgxpool.Pool
	Redis  *redis.Client // the targets' client; its commands are counted
	admin  *redis.Client // INFO and cleanup, not counted
	Schema string
	Prefix string // Redis key prefix, ends with ':'

	PGStatements *fixture.CountingDB // every statement the targets run
	RedisCmds    *fixture.RedisCounter

	forceFlush bool // pg_stat_force_next_flush() exists (PostgreSQL 15+)
}

// Open connects to both servers, creates a fresh schema idem_bench_<hex>
// holding the guard's and the ceiling's tables (migrated with
// durable.Migrate) and the minimal table, and picks a fresh Redis prefix
// idembench:<hex>:.
func Open(ctx context.Context, cfg Config) (env *Env, err error) {
	pc, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	if cfg.PoolSize > 0 {
		pc.MaxConns = int32(cfg.PoolSize)
	}
	var tag [6]byte
	_, _ = rand.Read(tag[:])
	schema := "idem_bench_" + hex.EncodeToString(tag[:])
	// fleet.Meter finds the backends that serve the targets by this name.
	pc.ConnConfig.RuntimeParams["application_name"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	ro := &redis.Options{Addr: cfg.RedisAddr, PoolSize: cfg.RedisPoolSize, ContextTimeoutEnabled: true, MaxRetries: -1}
	rdb := redis.NewClient(ro)
	admin := redis.NewClient(&redis.Options{Addr: cfg.RedisAddr, PoolSize: 2})
	if err := admin.Ping(pctx).Err(); err != nil {
		pool.Close()
		_ = rdb.Close()
		_ = admin.Close()
		return nil, fmt.Errorf("redis %s: %w", cfg.RedisAddr, err)
	}
	env = &Env{
		Pool:   pool,
		Redis:  rdb,
		admin:  admin,
		Schema: schema,
		Prefix: "idembench:" + hex.EncodeToString(tag[:]) + ":",

		PGStatements: fixture.NewCountingDB(pool),
		RedisCmds:    &fixture.RedisCounter{},
	}
	rdb.AddHook(env.RedisCmds)
	defer func() {
		if err != nil {
			env.Close(context.WithoutCancel(ctx))
			env = nil
		}
	}()
	for _, table := range []string{GuardTable, CeilingTable} {
		if err := durable.Migrate(ctx, pool, &durable.Config{Schema: env.Schema, Table: table}); err != nil {
			return env, err
		}
	}
	if err := createMinimalTable(ctx, env); err != nil {
		return env, err
	}
	_, err = pool.Exec(ctx, "SELECT pg_stat_force_next_flush()")
	env.forceFlush = err == nil
	return env, nil
}

// Close drops the bench schema, deletes the Redis keys under the prefix and
// closes the clients. It is safe to call on a partly opened Env.
func (e *Env) Close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var errs []error
	if _, err := e.Pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{e.Schema}.Sanitize()+" CASCADE"); err != nil {
		errs = append(errs, fmt.Errorf("drop schema %s: %w", e.Schema, err))
	}
	iter := e.admin.Scan(ctx, 0, e.Prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		e.admin.Del(ctx, iter.Val())
	}
	if err := iter.Err(); err != nil {
		errs = append(errs, fmt.Errorf("delete redis keys %s*: %w", e.Prefix, err))
	}
	e.Pool.Close()
	_ = e.Redis.Close()
	_ = e.admin.Close()
	return errors.Join(errs...)
}

// StatsFlushable reports whether PostgreSQL can flush table statistics on
// demand (version 15 and later), which makes Snapshot's tuple counts exact.
func (e *Env) StatsFlushable() bool { return e.forceFlush }

// Truncate empties a bench table, so that every step starts from the same
// state.
func (e *Env) Truncate(ctx context.Context, table string) error {
	_, err := e.Pool.Exec(ctx, "TRUNCATE "+pgx.Identifier{e.Schema, table}.Sanitize())
	return err
}

// Counters is a snapshot of what the servers and clients have counted.
type Counters struct {
	PGStatements int64  // statements the targets ran (client side)
	TupleWrites  int64  // n_tup_ins + n_tup_upd + n_tup_del of the table
	WALLSN       string // pg_current_wal_insert_lsn(), server-wide
	RedisServer  int64  // INFO commandstats calls, all commands but INFO
	RedisClient  int64  // commands the targets' client sent
}

// Delta is what happened between two snapshots.
type Delta struct {
	PGStatements, TupleWrites, WALBytes, RedisServer, RedisClient int64
	// Exact is false when PostgreSQL's statistics could not be flushed on
	// demand (before version 15): TupleWrites may then lag.
	Exact bool
}

// Snapshot reads the counters of table. Call it when no request is in flight:
// it first makes every idle pool connection flush its pending table
// statistics (pg_stat_force_next_flush, PostgreSQL 15+), since PostgreSQL
// otherwise publishes them up to a second or more later.
func (e *Env) Snapshot(ctx context.Context, table string) (Counters, error) {
	var c Counters
	if e.forceFlush {
		for _, conn := range e.Pool.AcquireAllIdle(ctx) {
			_, err := conn.Exec(ctx, "SELECT pg_stat_force_next_flush()")
			conn.Release()
			if err != nil {
				return c, fmt.Errorf("flush statistics: %w", err)
			}
		}
	}
	err := e.Pool.QueryRow(ctx, `
SELECT coalesce((SELECT n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables
	WHERE schemaname = $1 AND relname = $2), 0),
	pg_current_wal_insert_lsn()::text`, e.Schema, table).Scan(&c.TupleWrites, &c.WALLSN)
	if err != nil {
		return c, fmt.Errorf("table statistics: %w", err)
	}
	info, err := e.admin.Info(ctx, "commandstats").Result()
	if err != nil {
		return c, fmt.Errorf("redis INFO commandstats: %w", err)
	}
	c.RedisServer = commandCalls(info)
	c.PGStatements = e.PGStatements.Count()
	c.RedisClient = e.RedisCmds.Count()
	return c, nil
}

// Since returns the counters' growth from before to after.
func (e *Env) Since(ctx context.Context, before, after Counters) (Delta, error) {
	d := Delta{
		PGStatements: after.PGStatements - before.PGStatements,
		TupleWrites:  after.TupleWrites - before.TupleWrites,
		RedisServer:  after.RedisServer - before.RedisServer,
		RedisClient:  after.RedisClient - before.RedisClient,
		Exact:        e.forceFlush,
	}
	err := e.Pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint",
		after.WALLSN, before.WALLSN).Scan(&d.WALBytes)
	return d, err
}

// commandCalls sums the calls of every command in an INFO commandstats
// reply except INFO itself (the snapshots' own).
func commandCalls(info string) int64 {
	var total int64
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
			continue
		}
		for field := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(field, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err == nil {
					total += n
				}
			}
		}
	}
	return total
}

// Versions returns the servers' versions and the settings that matter for
// the figures, for the report.
func (e *Env) Versions(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	for _, name := range []string{"server_version", "synchronous_commit", "fsync", "shared_buffers", "max_connections", "autovacuum"} {
		var v string
		if err := e.Pool.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			return nil, err
		}
		out["postgres_"+name] = v
	}
	for _, section := range []string{"server", "persistence"} {
		info, err := e.admin.Info(ctx, section).Result()
		if err != nil {
			return nil, err
		}
		for line := range strings.Lines(info) {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if ok && (k == "redis_version" || k == "aof_enabled") {
				out["redis_"+k] = v
			}
		}
	}
	return out, nil
}
