// Package target sets up what the capacity planner drives, on a schema and
// a Redis key prefix of their own: the real idem.Guard under each strategy
// (in process, or behind its HTTP middleware in a worker process) and the
// minimal SQL behind the same HTTP path, the least SQL that does the job on
// the least schema.
package target

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idem/bench/internal/fixture"
	"github.com/idemguard/idem/durable"
)

// Tables of the bench schema: the guard's (migrated with durable.Migrate)
// and the minimal one.
const (
	GuardTable   = "idempotency_keys" // durable.Migrate's, in the bench schema
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
}

// Open connects to both servers, creates a fresh schema idem_bench_<hex>
// holding the guard's table (migrated with durable.Migrate) and the minimal
// table, and picks a fresh Redis prefix idembench:<hex>:.
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
	if err := durable.Migrate(ctx, pool, &durable.Config{Schema: env.Schema}); err != nil {
		return env, err
	}
	if err := createMinimalTable(ctx, env); err != nil {
		return env, err
	}
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

// SeedRows is how many answered keys a bench table holds when a run starts
// (Reset).
const SeedRows = 20_000

// Reset empties a bench table (GuardTable or MinimalTable), so that every
// run starts from the same state, then fills it with SeedRows answered keys
// of other callers and ANALYZEs it, as a table in service is: its planner
// statistics then say what a day's keys make of it. An empty table has no
// statistics, and the plans prepared statements keep from while it was
// nearly empty (after their fifth execution) are not a table in service's:
// the shared insert before 01ab2b1 read such a table whole, and runs of one
// build varied twofold in PostgreSQL's CPU per request, by when each
// connection's plans were made.
func (e *Env) Reset(ctx context.Context, table string) error {
	t := pgx.Identifier{e.Schema, table}.Sanitize()
	seed := `
INSERT INTO ` + t + ` (user_id, key, request_hash, owner_token, response_status, response_headers, response_body, created_at)
SELECT 'seed-' || (g % 1000), 'seed-' || g, sha256(g::text::bytea), sha256(('o' || g)::bytea), 201,
	'{"Location":["/orders/seed"]}', '\x7b7d', now() - interval '1 hour'
FROM generate_series(1, $1::int) AS g`
	if table == GuardTable {
		seed = `
INSERT INTO ` + t + ` (user_id, key, request_hash, owner_token, created_at, hold_until, retention,
	response_status, response_headers, response_body, completed_at)
SELECT 'seed-' || (g % 1000), 'seed-' || g, sha256(g::text::bytea), sha256(('o' || g)::bytea),
	now() - interval '1 hour', now() - interval '1 hour' + interval '46.5 seconds', interval '24 hours',
	201, '{"Location":["/orders/seed"]}', '\x7b7d', now() - interval '1 hour'
FROM generate_series(1, $1::int) AS g`
	}
	for _, q := range []struct {
		sql  string
		args []any
	}{{"TRUNCATE " + t, nil}, {seed, []any{SeedRows}}, {"ANALYZE " + t, nil}} {
		if _, err := e.Pool.Exec(ctx, q.sql, q.args...); err != nil {
			return fmt.Errorf("reset %s: %w", table, err)
		}
	}
	return nil
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
