package durable

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// schemaVersion is the version of the table's schema that this build's
// statements are written for: the number of the last migration it embeds
// (TestSchemaVersionIsTheLastMigration). The migrations record the version
// of a table in the view <table>_schema, which every tool that applies them
// as plain SQL creates too.
const schemaVersion = 1

// schemaRecheck is how long a Store trusts the version it found before it
// reads it again on its next admitting statement: a table migrated ahead
// while an instance of an older build runs is refused by that instance
// within this long.
const schemaRecheck = time.Minute

// errSchemaNewer is the kind of an error that the table's schema is newer
// than this build: its rules may differ from the ones the build's statements
// follow, so the build must not serve it.
var errSchemaNewer = errors.New("the table's schema is newer than this build")

// schemaCheck remembers when a Store (and its copies, see Store.WithDB)
// last found its table at the version it serves.
type schemaCheck struct {
	sql string // reads <table>_schema
	// ok is when the version was last found right, in nanoseconds on the
	// monotonic clock since epoch (0: never).
	ok       atomic.Int64
	checking atomic.Bool      // a recheck is in flight
	now      func() time.Time // time.Now; tests move it
	epoch    time.Time        // the origin of ok
}

func newSchemaCheck(view string) *schemaCheck {
	now := time.Now
	return &schemaCheck{sql: "SELECT version FROM " + view, now: now, epoch: now()}
}

// ready reports an error when the table is not at the version this build
// serves, reading the version through db when it was not found right in the
// last schemaRecheck. While a version found right earlier is read again, the
// other callers go on; once a reading fails, every caller reads it until one
// finds it right.
func (c *schemaCheck) ready(ctx context.Context, db DB, op, table string) error {
	ok := c.ok.Load()
	if ok != 0 && c.since(ok) < schemaRecheck {
		return nil
	}
	if ok != 0 {
		if !c.checking.CompareAndSwap(false, true) {
			return nil // another caller reads it again
		}
		defer c.checking.Store(false)
	}
	err := c.read(ctx, db, op, table)
	if err != nil {
		c.ok.Store(0)
		return err
	}
	c.ok.Store(max(int64(c.now().Sub(c.epoch)), 1))
	return nil
}

// since is how long ago the monotonic reading ok was taken.
func (c *schemaCheck) since(ok int64) time.Duration {
	return c.now().Sub(c.epoch) - time.Duration(ok)
}

// read reads the table's version and reports an error when it is not the
// one this build serves.
func (c *schemaCheck) read(ctx context.Context, db DB, op, table string) error {
	var v int64
	if err := db.QueryRow(ctx, c.sql).Scan(&v); err != nil {
		return translate(op, err)
	}
	switch {
	case v > schemaVersion:
		return &opError{op: op, kind: errSchemaNewer, err: fmt.Errorf(
			"%s is at schema version %d and this build serves version %d: deploy a build that serves version %d (docs/operating.md, Schema changes)",
			table, v, schemaVersion, v)}
	case v < schemaVersion:
		return &opError{op: op, kind: errNotMigrated, err: fmt.Errorf(
			"%s is at schema version %d and this build serves version %d", table, v, schemaVersion)}
	}
	return nil
}
