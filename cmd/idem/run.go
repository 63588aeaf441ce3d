package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemguard/idem/durable"
)

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// defaultDatabaseURL is used when neither -database-url nor $DATABASE_URL is
// set.
const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

const usage = `usage: idem <command> [flags]

Commands:
  migrate up [-partitions N]     apply the migrations this build embeds
  migrate down [-to N]           undo the newest applied migration, or every one above N
  migrate status                 list the migrations and whether each is applied
  inspect <scope> <key>          show a key's row (and, with -redis, its lease)
  pending [-limit N]             list the keys waiting for reconciliation, oldest first
  settle <scope> <key> -owner T -status N [-header k:v]... [-body @file | -body-text s]
                                 store the answer of a key left in progress
  release <scope> <key> -owner T release a key left in progress: its next retry runs
  stats                          count the keys per state

Flags of every command:
  -database-url URL   PostgreSQL (default $DATABASE_URL, else ` + defaultDatabaseURL + `)
  -schema NAME        the table's schema (default: the connection's current schema)
  -retention D        the retention settle and release give a key when it is longer
                      than the row's own, as the Guard's store has it (default 24h)
  -json               print JSON instead of text

Run "idem <command> -h" for a command's own flags.
`

// usageError is a mistake in the command line: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// run is the command: args without the program's name. It writes results to
// stdout and errors and audit lines to stderr, and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	var (
		err error
		c   = &cmd{stdout: stdout, stderr: stderr}
	)
	switch name, rest := args[0], args[1:]; name {
	case "migrate":
		err = c.migrate(ctx, rest)
	case "inspect":
		err = c.inspect(ctx, rest)
	case "pending":
		err = c.pending(ctx, rest)
	case "settle":
		err = c.settle(ctx, rest)
	case "release":
		err = c.release(ctx, rest)
	case "stats":
		err = c.stats(ctx, rest)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		err = usagef("unknown command %q", name)
	}
	var uerr usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &uerr):
		fmt.Fprintf(stderr, "idem: %s\nRun \"idem help\" for usage.\n", uerr.msg)
		return exitUsage
	}
	// An error of package idem names itself already.
	msg := err.Error()
	if !strings.HasPrefix(msg, "idem: ") {
		msg = "idem: " + msg
	}
	fmt.Fprintln(stderr, msg)
	return exitFail
}

// cmd is one run of the command: its output and the flags every command
// shares, once parsed.
type cmd struct {
	stdout, stderr io.Writer
	databaseURL    string
	cfg            durable.Config
	json           bool
}

// flags returns the flag set of command name with the shared flags.
func (c *cmd) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("idem "+name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	// No default in the flag itself: -h prints defaults, and $DATABASE_URL
	// may hold a password.
	fs.StringVar(&c.databaseURL, "database-url", "", "PostgreSQL connection URL (default $DATABASE_URL, else "+defaultDatabaseURL+")")
	fs.StringVar(&c.cfg.Schema, "schema", "", "the table's schema (default: the connection's current schema)")
	fs.DurationVar(&c.cfg.Retention, "retention", durable.DefaultRetention, "the retention settle and release give a key when it is longer than the row's own (durable.Config.Retention)")
	fs.BoolVar(&c.json, "json", false, "print JSON instead of text")
	return fs
}

// parse parses args with fs, flags and positional arguments in any order, and
// returns the positional ones, which must number want.
//
// Everything after "--" is positional, for a scope or key that starts with
// '-'.
func (c *cmd) parse(fs *flag.FlagSet, args []string, want int, names string) ([]string, error) {
	var pos, rest []string
	if i := slices.Index(args, "--"); i >= 0 {
		args, rest = args[:i], args[i+1:]
	}
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usageError{err.Error()}
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	pos = append(pos, rest...)
	if len(pos) != want {
		if want == 0 {
			return nil, usagef("%s takes no arguments, got %q", fs.Name(), pos)
		}
		return nil, usagef("%s needs %s, got %d argument(s)", fs.Name(), names, len(pos))
	}
	if err := c.cfg.Validate(); err != nil {
		return nil, usageError{err.Error()}
	}
	return pos, nil
}

// connect opens a small pool on the database.
func (c *cmd) connect(ctx context.Context) (*pgxpool.Pool, error) {
	url := c.databaseURL
	if url == "" {
		url = os.Getenv("DATABASE_URL")
	}
	if url == "" {
		url = defaultDatabaseURL
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, usagef("-database-url: %v", err)
	}
	pcfg.MaxConns = 2
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(cctx, pcfg)
	if err == nil {
		if err = pool.Ping(cctx); err != nil {
			pool.Close()
		}
	}
	if err != nil {
		// host:port/database names the server without the URL's password.
		cc := pcfg.ConnConfig
		return nil, fmt.Errorf("connect to PostgreSQL at %s:%d/%s: %w", cc.Host, cc.Port, cc.Database, err)
	}
	return pool, nil
}

// store connects and returns a Store on the table, once it has checked that
// every migration this build embeds is applied.
func (c *cmd) store(ctx context.Context) (*durable.Store, *pgxpool.Pool, error) {
	pool, err := c.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	st, err := durable.New(pool, &c.cfg)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	vs, err := durable.MigrationStatus(ctx, pool, &c.cfg)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	applied, missing := 0, 0
	for _, v := range vs {
		switch {
		case v.Applied:
			applied++
		case !v.Applied && v.Name != "":
			missing++
		}
	}
	if missing > 0 {
		pool.Close()
		return nil, nil, fmt.Errorf("table %s is not migrated (%d of %d migrations applied): run `idem migrate up`%s",
			c.table(), applied, applied+missing, c.sameFlags())
	}
	return st, pool, nil
}

// sameFlags repeats the table flags for a hint naming another command.
func (c *cmd) sameFlags() string {
	var b strings.Builder
	if c.cfg.Schema != "" {
		b.WriteString(" -schema " + c.cfg.Schema)
	}
	if b.Len() == 0 {
		return ""
	}
	return " with" + b.String()
}

// printJSON writes v as indented JSON.
func (c *cmd) printJSON(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// stamp formats a time of the database's clock; the zero time is "-".
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

// human rounds a duration for reading.
func human(d time.Duration) string {
	switch a := max(d, -d); {
	case a >= 10*time.Second:
		return d.Round(time.Second).String()
	case a >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}
