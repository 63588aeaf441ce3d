package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
)

// keyJSON is a key's row in -json output.
type keyJSON struct {
	KeyHash     string      `json:"key_hash"`
	Scope       string      `json:"scope"`
	Key         string      `json:"key"`
	State       string      `json:"state"`
	Pending     bool        `json:"pending"`
	Fingerprint string      `json:"fingerprint"`
	Owner       string      `json:"owner"`
	Intent      string      `json:"intent"`
	Attempt     int         `json:"attempt"`
	CreatedAt   time.Time   `json:"created_at"`
	HoldUntil   *time.Time  `json:"hold_until,omitempty"`
	HoldLeftMS  int64       `json:"hold_left_ms"`
	CompletedAt *time.Time  `json:"completed_at,omitempty"`
	ReleasedAt  *time.Time  `json:"released_at,omitempty"`
	Status      int         `json:"status,omitempty"`
	Header      http.Header `json:"header,omitempty"`
	BodySize    int         `json:"body_size"`
	Body        *string     `json:"body,omitempty"`
	// RetentionLeftMS is how long the row still lives; absent while in
	// progress (it never expires), negative once expired.
	RetentionLeftMS   *int64     `json:"retention_left_ms,omitempty"`
	ReconcileAttempts int        `json:"reconcile_attempts"`
	ReconcileAfter    *time.Time `json:"reconcile_after,omitempty"`
	Lease             *leaseInfo `json:"lease,omitempty"`
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func toJSON(r durable.KeyRow, withBody bool) keyJSON {
	j := keyJSON{
		KeyHash: idem.KeyHash(r.Scope, r.Key), Scope: r.Scope, Key: r.Key,
		State: r.State, Pending: pending(r),
		Fingerprint: hex.EncodeToString(r.Fingerprint[:]),
		Owner:       r.Owner.String(), Intent: r.Intent.String(), Attempt: r.Attempt,
		CreatedAt: r.CreatedAt, HoldUntil: optTime(r.HoldUntil), HoldLeftMS: r.HoldLeft.Milliseconds(),
		CompletedAt: optTime(r.CompletedAt), ReleasedAt: optTime(r.ReleasedAt),
		ReconcileAttempts: r.ReconcileAttempts, ReconcileAfter: optTime(r.ReconcileAfter),
	}
	if r.State != durable.StateInProgress {
		ms := r.TTL.Milliseconds()
		j.RetentionLeftMS = &ms
	}
	if a := r.Answer; a != nil {
		j.Status, j.Header, j.BodySize = a.Status, a.Header, len(a.Body)
		if withBody {
			b := string(a.Body)
			j.Body = &b
		}
	}
	return j
}

// pending reports whether the row waits for reconciliation: in progress
// and past its hold.
func pending(r durable.KeyRow) bool { return r.State == durable.StateInProgress && !r.Held() }

// inspect runs "inspect <scope> <key>".
func (c *cmd) inspect(ctx context.Context, args []string) error {
	fs := c.flags("inspect")
	withBody := fs.Bool("body", false, "print the stored body")
	redisAddr := fs.String("redis", "", "Redis address (host:port) of the hybrid strategy's leases, read only")
	prefix := fs.String("lock-prefix", "idem:", "the lock's key prefix (lock.Config.Prefix)")
	pos, err := c.parse(fs, args, 2, "<scope> <key>")
	if err != nil {
		return err
	}
	scope, key := pos[0], pos[1]
	st, pool, err := c.store(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	row, err := st.Inspect(ctx, scope, key)
	if errors.Is(err, idem.ErrNotFound) {
		return fmt.Errorf("inspect: no row for key_hash %s in %s (never claimed, or expired and swept)", idem.KeyHash(scope, key), c.table())
	}
	if err != nil {
		return err
	}
	var lease *leaseInfo
	if *redisAddr != "" {
		if lease, err = peekLease(ctx, *redisAddr, *prefix, row); err != nil {
			return err
		}
	}
	if c.json {
		j := toJSON(row, *withBody)
		j.Lease = lease
		return c.printJSON(j)
	}
	w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	line := func(name, format string, args ...any) {
		fmt.Fprintf(w, "%s\t"+format+"\n", append([]any{name}, args...)...)
	}
	line("key_hash", "%s", idem.KeyHash(scope, key))
	line("table", "%s", c.table())
	line("state", "%s", describeState(row))
	line("fingerprint", "%x", row.Fingerprint[:])
	line("owner", "%s", row.Owner)
	line("intent", "%s", row.Intent)
	line("attempt", "%d", row.Attempt)
	line("claimed", "%s", stamp(row.CreatedAt))
	line("hold", "%s", describeHold(row))
	if row.State == durable.StateInProgress {
		line("reconcile", "%s", describeReconcile(row))
	}
	if !row.CompletedAt.IsZero() {
		line("answered", "%s", stamp(row.CompletedAt))
	}
	if !row.ReleasedAt.IsZero() {
		line("released", "%s", stamp(row.ReleasedAt))
	}
	if a := row.Answer; a != nil {
		line("status", "%d", a.Status)
		names := make([]string, 0, len(a.Header))
		for name := range a.Header {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			for _, v := range a.Header[name] {
				line("header", "%s: %s", name, v)
			}
		}
		line("body", "%d bytes", len(a.Body))
	}
	line("retention", "%s", describeRetention(row))
	if lease != nil {
		line("lease", "%s", lease.describe())
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if *withBody && row.Answer != nil {
		fmt.Fprintf(c.stdout, "\n%s\n", row.Answer.Body)
	}
	return nil
}

func describeState(r durable.KeyRow) string {
	switch {
	case r.State != durable.StateInProgress:
		return r.State
	case r.Held():
		return r.State + " (held by its execution)"
	}
	return r.State + " (pending: waits for reconciliation)"
}

func describeHold(r durable.KeyRow) string {
	switch {
	case r.State != durable.StateInProgress:
		return fmt.Sprintf("until %s", stamp(r.HoldUntil))
	case r.HoldLeft > 0:
		return fmt.Sprintf("%s left, until %s", human(r.HoldLeft), stamp(r.HoldUntil))
	}
	return fmt.Sprintf("passed %s ago, at %s", human(-r.HoldLeft), stamp(r.HoldUntil))
}

func describeReconcile(r durable.KeyRow) string {
	if r.ReconcileAttempts == 0 && r.ReconcileAfter.IsZero() {
		return "not postponed"
	}
	return fmt.Sprintf("%d failed attempt(s), next after %s", r.ReconcileAttempts, stamp(r.ReconcileAfter))
}

func describeRetention(r durable.KeyRow) string {
	switch r.State {
	case durable.StateInProgress:
		return fmt.Sprintf("never expires while in progress; its answer will live %s", human(r.TTL))
	case durable.StateExpired:
		return fmt.Sprintf("expired %s ago: the next claim takes it over as a new intent", human(-r.TTL))
	}
	return fmt.Sprintf("%s left", human(r.TTL))
}

// pending runs "pending".
func (c *cmd) pending(ctx context.Context, args []string) error {
	fs := c.flags("pending")
	limit := fs.Int("limit", 100, "list at most this many keys")
	if _, err := c.parse(fs, args, 0, ""); err != nil {
		return err
	}
	if *limit < 1 {
		return usagef("-limit %d: must be at least 1", *limit)
	}
	st, pool, err := c.store(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	rows, err := st.ListPending(ctx, *limit)
	if err != nil {
		return err
	}
	if c.json {
		out := make([]keyJSON, len(rows))
		for i, r := range rows {
			out[i] = toJSON(r, false)
		}
		return c.printJSON(out)
	}
	if len(rows) == 0 {
		fmt.Fprintf(c.stdout, "%s: no key waits for reconciliation\n", c.table())
		return nil
	}
	w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CLAIMED\tPAST HOLD\tATTEMPT\tRECONCILE\tOWNER\tKEY_HASH\tSCOPE\tKEY")
	for _, r := range rows {
		past := "-"
		if !r.HoldUntil.IsZero() {
			past = human(-r.HoldLeft)
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\t%s\t%q\t%q\n", stamp(r.CreatedAt), past, r.Attempt,
			r.ReconcileAttempts, r.Owner, idem.KeyHash(r.Scope, r.Key), r.Scope, r.Key)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(rows) == *limit {
		fmt.Fprintf(c.stdout, "(first %d; more may wait: raise -limit)\n", *limit)
	}
	return nil
}

// stats runs "stats".
func (c *cmd) stats(ctx context.Context, args []string) error {
	fs := c.flags("stats")
	if _, err := c.parse(fs, args, 0, ""); err != nil {
		return err
	}
	st, pool, err := c.store(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	n, err := st.CountStates(ctx)
	if err != nil {
		return err
	}
	if c.json {
		return c.printJSON(struct {
			Table      string `json:"table"`
			InProgress int64  `json:"in_progress"`
			Held       int64  `json:"held"`
			Pending    int64  `json:"pending"`
			Answered   int64  `json:"answered"`
			Released   int64  `json:"released"`
			Expired    int64  `json:"expired"`
		}{c.table(), n.InProgress, n.InProgress - n.Pending, n.Pending, n.Answered, n.Released, n.Expired})
	}
	fmt.Fprintf(c.stdout, "%s\n", c.table())
	for _, l := range []struct {
		name string
		n    int64
	}{
		{"in_progress", n.InProgress}, {"  held", n.InProgress - n.Pending}, {"  pending", n.Pending},
		{"answered", n.Answered}, {"released", n.Released}, {"expired", n.Expired},
	} {
		fmt.Fprintf(c.stdout, "%-12s %10d\n", l.name, l.n)
	}
	return nil
}

// headerFlag collects -header name:value flags.
type headerFlag struct{ h http.Header }

func (f *headerFlag) String() string { return "" }

func (f *headerFlag) Set(s string) error {
	name, value, ok := strings.Cut(s, ":")
	name = strings.TrimSpace(name)
	if !ok || name == "" {
		return fmt.Errorf("%q is not name:value", s)
	}
	if f.h == nil {
		f.h = http.Header{}
	}
	f.h.Add(name, strings.TrimSpace(value))
	return nil
}
