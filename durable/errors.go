package durable

import (
	"errors"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemguard/idem"
)

// opError is an error of one Store operation. It unwraps to its kind (one of
// the package's sentinels, or nil) and to its cause, so that both errors.Is
// against the sentinel and errors.Is/As against the driver's error (a
// context error, a *pgconn.PgError) work.
type opError struct {
	op   string // "claim", "migrate", ...
	kind error  // a sentinel such as idem.ErrInvalid, or nil
	err  error  // the cause
}

func (e *opError) Error() string {
	var b strings.Builder
	b.WriteString("durable: ")
	b.WriteString(e.op)
	b.WriteString(": ")
	if e.kind != nil {
		b.WriteString(strings.TrimPrefix(e.kind.Error(), "idem: "))
		if e.err == nil {
			return b.String()
		}
		b.WriteString(": ")
	}
	if e.err != nil {
		b.WriteString(oneLine(e.err.Error()))
	}
	return b.String()
}

// oneLine joins the lines of a driver's message (pgx puts each address it
// failed to connect to on a line of its own) so that the error reads as one
// log line: a line ending in ':' runs on into the next, the others are
// separated by "; ".
func oneLine(s string) string {
	if !strings.Contains(s, "\n") {
		return s
	}
	var b strings.Builder
	for i, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if i > 0 && b.Len() > 0 {
			if strings.HasSuffix(b.String(), ":") {
				b.WriteString(" ")
			} else {
				b.WriteString("; ")
			}
		}
		b.WriteString(line)
	}
	return b.String()
}

func (e *opError) Unwrap() []error {
	errs := make([]error, 0, 2)
	if e.kind != nil {
		errs = append(errs, e.kind)
	}
	if e.err != nil {
		errs = append(errs, e.err)
	}
	return errs
}

// translate turns an error of the driver into the package's errors. It is the
// only place that looks at driver errors:
//
//   - pgx.ErrNoRows becomes idem.ErrNotFound;
//   - SQLSTATE class 22 (data exception: invalid byte sequence, unsupported
//     Unicode escape, value out of range, ...) and 23514 (check violation)
//     wrap idem.ErrInvalid;
//   - 23505 (unique violation) wraps idem.ErrExists;
//   - 42P01 (undefined table) and 42703 (undefined column) say that the
//     schema lacks what this build needs: errNotMigrated names the fix;
//   - 26000 and 42P05 (a prepared statement missing, or another's of the
//     same name) say what they mean behind a pooler (errStatementCache);
//   - anything else is wrapped with the operation's name.
//
// The cause stays reachable with errors.Is and errors.As.
func translate(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.ErrNotFound
	}
	var kind error
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		switch {
		case strings.HasPrefix(pgErr.Code, "22"), pgErr.Code == "23514":
			kind = idem.ErrInvalid
		case pgErr.Code == "23505":
			kind = idem.ErrExists
		case pgErr.Code == "42P01", pgErr.Code == "42703":
			kind = errNotMigrated
		case statementLost(err):
			kind = errStatementCache
		}
	}
	return &opError{op: op, kind: kind, err: err}
}

// errNotMigrated is the kind of an error that a table or column of the
// schema is missing: the migrations this build needs have not run.
var errNotMigrated = errors.New("the schema lacks a table or column of this build: run durable.Migrate")

// invalid reports a bad argument found before any round trip.
func invalid(op, detail string) error {
	return &opError{op: op, kind: idem.ErrInvalid, err: errors.New(detail)}
}

// checkText reports whether s can be stored in a text column: PostgreSQL
// rejects NUL bytes and, in a UTF8 database, invalid UTF-8. Checking it here
// saves a round trip and keeps a caller's transaction usable.
func checkText(op, field, s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return invalid(op, field+" contains a NUL byte")
	}
	if !utf8.ValidString(s) {
		return invalid(op, field+" is not valid UTF-8")
	}
	return nil
}
