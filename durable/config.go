package durable

import (
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"
)

// Defaults of [Config].
const (
	// DefaultRetention is how long a key lives when Config.Retention is 0.
	DefaultRetention = 24 * time.Hour
	// DefaultAdmissionWait is Config.AdmissionWait when it is 0.
	DefaultAdmissionWait = time.Second
)

// table is the name of the table the migrations create, in Config.Schema;
// the names of the objects beside it (indexes, the reconciler's and the
// leases' tables, the schema view) start with it.
const table = "idempotency_keys"

const (
	maxSchemaLen = 63
	// maxPartitions bounds Config.Partitions; partition names end in
	// _p0 ... _p1023.
	maxPartitions = 1024
)

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// Config configures a [Store] and [Migrate]. The zero value, like a nil
// *Config, gives the defaults. A Config is copied by [New] and may be reused.
type Config struct {
	// Schema is the schema that holds the table. It must match
	// ^[a-z_][a-z0-9_]*$. [Migrate] creates it if it does not exist.
	//
	// Defaults to "": the connection's current schema (the first existing
	// schema of its search_path), with unqualified names in SQL.
	Schema string

	// Retention is how long a key lives after its answer or its release,
	// measured on the database clock from completed_at or released_at; a
	// row in progress never expires. Each row keeps the retention of the
	// Store that claimed it, or of a Store that answered or released it if
	// that is longer, so Stores with different retentions may share a
	// table. An expired row is invisible to every call and is taken over by
	// the next Claim of its key, even before a [Sweeper] deletes it. It is
	// passed to SQL in whole microseconds.
	//
	// Defaults to 24h.
	Retention time.Duration

	// Notify makes Complete and Release announce the key on the table's
	// notification channel (pg_notify, in the same statement, so at the
	// writer's commit), for a [Listener] to wake the requests that wait for
	// the key's answer. Every instance that writes the table must set it
	// for waiting to work; an instance without it only leaves waiters to
	// their timeout.
	//
	// WARNING: PostgreSQL serialises the commits of transactions that
	// notify; measure the write rate you need (bench: BenchmarkNotifyCost).
	//
	// Defaults to false.
	Notify bool

	// AdmissionWait bounds how long Claim and Get, the statements that
	// admit a request, wait for a free connection when the Store runs over
	// a *pgxpool.Pool. Past it they fail at once (the guard answers 503 with
	// Retry-After) instead of queueing for the caller's whole timeout: when
	// PostgreSQL slows down, a queue of requests that will time out anyway
	// would keep every connection busy long after it recovers. The answer
	// write and the release wait as long as their context allows: their
	// work has run. Size the pool for the load (docs/configuration.md).
	//
	// Defaults to 1s.
	AdmissionWait time.Duration

	// AsynchronousAnswers makes an answer write return before its WAL
	// flush (synchronous_commit off for that one statement), which saves
	// the flush's wait. By default an answer write returns once its commit
	// is on disk, like the claim, so every answer a client reads survives a
	// PostgreSQL crash. An answer written through a caller's transaction
	// ([Store.WithDB]) always commits with that transaction's own settings;
	// one written under a lease (the reconciler's settle, see [Store.Lead])
	// always waits for its flush.
	//
	// WARNING: with it, a crash of PostgreSQL (the OOM killer ending one
	// backend restarts them all) within about three times wal_writer_delay
	// of an answer loses that acknowledged answer. Its key comes back in
	// progress and its work never runs again, but the client that read the
	// answer holds one PostgreSQL no longer has: a hybrid Guard may keep
	// replaying it from Redis, and the reconciler later stores the answer it
	// rebuilds, which can differ. Every retry then no longer gets the same
	// answer (docs/strategies.md, "The answer's commit").
	//
	// Defaults to false.
	AsynchronousAnswers bool

	// Partitions, when positive, makes [Migrate] create the table
	// hash-partitioned on user_id (the scope) into that many partitions,
	// named idempotency_keys_p0, idempotency_keys_p1, ...: every statement of a Store on one key
	// then reads and writes one partition, and a partition's indexes are a
	// fraction of the table's. It is the layout Citus distributes on
	// (distribution column user_id); see docs/scaling.md for when to use it.
	//
	// The layout is chosen when Migrate creates the table and cannot change
	// afterwards without moving the rows: Migrate refuses a Config whose
	// Partitions do not match the existing table. A Store works on either
	// layout and does not read this field.
	//
	// At most 1024. Defaults to 0: one plain table.
	Partitions int

	// Logger is the logger of the store's background parts: a [Sweeper]
	// logs one line per run (Info when rows were deleted, Debug when there
	// was nothing to do or another instance held the lease, Error when the
	// run failed), a [Listener] its lost and regained connections. Give it
	// the Guard's (idem.Config.Logger), as pgidem does. Migrate does not
	// read it.
	//
	// Defaults to slog.Default().
	Logger *slog.Logger

	// MeterProvider, when set, receives the metrics of the store's
	// background parts through the OpenTelemetry metric API: a [Sweeper]'s
	// counter "idem.sweep.deleted" (rows), counter "idem.sweep.runs" and
	// histogram "idem.sweep.duration" (seconds), both by outcome (ok, error,
	// stopped), for every run that obtained the lease. Give it the Guard's
	// (idem.Config.MeterProvider), as pgidem does.
	//
	// Defaults to nil: no metrics.
	MeterProvider metric.MeterProvider
}

// Validate reports whether cfg (nil is valid) would be accepted by New and
// Migrate, naming the offending field, without contacting the database.
// Command-line tools use it to report a bad flag before connecting.
func (cfg *Config) Validate() error {
	_, err := cfg.withDefaults()
	return err
}

// withDefaults returns a validated copy of cfg (which may be nil) with the
// defaults filled in.
func (cfg *Config) withDefaults() (Config, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.AdmissionWait == 0 {
		c.AdmissionWait = DefaultAdmissionWait
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, c.validate()
}

func (c *Config) validate() error {
	if c.Schema != "" {
		if len(c.Schema) > maxSchemaLen {
			return fmt.Errorf("durable: Config.Schema: %q is longer than %d bytes", c.Schema, maxSchemaLen)
		}
		if !identRE.MatchString(c.Schema) {
			return fmt.Errorf("durable: Config.Schema: %q does not match %s", c.Schema, identRE)
		}
	}
	if c.Retention < 0 {
		return fmt.Errorf("durable: Config.Retention: must not be negative, got %v", c.Retention)
	}
	if c.Retention < time.Microsecond {
		return fmt.Errorf("durable: Config.Retention: must be at least 1µs, got %v", c.Retention)
	}
	if c.Partitions < 0 {
		return fmt.Errorf("durable: Config.Partitions: must not be negative, got %d", c.Partitions)
	}
	if c.Partitions > maxPartitions {
		return fmt.Errorf("durable: Config.Partitions: must be at most %d, got %d", maxPartitions, c.Partitions)
	}
	if c.AdmissionWait < 0 {
		return fmt.Errorf("durable: Config.AdmissionWait: must not be negative, got %v", c.AdmissionWait)
	}
	return nil
}

// qualified returns the quoted, schema-qualified name of the table (or only
// the quoted table name when no schema is set).
func (c *Config) qualified() string { return c.qualifiedAs(table) }

// qualifiedAs is qualified for another table of the same schema, such as the
// table's name with a suffix the migrations give a table beside it.
func (c *Config) qualifiedAs(table string) string {
	if c.Schema == "" {
		return pgx.Identifier{table}.Sanitize()
	}
	return pgx.Identifier{c.Schema, table}.Sanitize()
}

var errNilDB = errors.New("durable: db is nil")
