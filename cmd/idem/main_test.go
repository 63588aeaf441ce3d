package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/testdb"
	"github.com/idemguard/idem/internal/testredis"
	"github.com/idemguard/idem/lock"
)

// bundle is a test's database: a schema of its own, migrated by the
// command, and a Store on it.
type bundle struct {
	pool   *pgxpool.Pool
	schema string
	store  *durable.Store
}

// setup migrates a fresh schema with "idem migrate up" and returns it.
func setup(t *testing.T) *bundle {
	t.Helper()
	pool := testdb.Pool(t)
	b := &bundle{pool: pool, schema: testdb.SchemaName(t, pool)}
	out, errOut, code := b.idem(t, "migrate", "up")
	require.Equal(t, exitOK, code, "stderr: %s", errOut)
	require.Contains(t, out, "applied migration(s) [1]")
	st, err := durable.New(pool, &durable.Config{Schema: b.schema})
	require.NoError(t, err)
	b.store = st
	return b
}

// idem runs the command on b's schema and returns its stdout, stderr and
// exit status.
func (b *bundle) idem(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	common := []string{"-database-url", testdb.URL(), "-schema", b.schema}
	if i := slices.Index(args, "--"); i >= 0 {
		args = slices.Concat(args[:i], common, args[i:])
	} else {
		args = append(args, common...)
	}
	code = run(t.Context(), args, &out, &errOut)
	return out.String(), errOut.String(), code
}

// claim leaves a key in progress under a fresh owner, held for hold (0: past
// its hold at once, pending), as a request that died mid-work does.
func (b *bundle) claim(t *testing.T, req idem.Request, hold time.Duration) idem.Record {
	t.Helper()
	var owner idem.Token
	_, _ = rand.Read(owner[:])
	rec, claimed, err := b.store.Claim(t.Context(), idem.ClaimParams{
		Scope: req.Scope, Key: req.Key, Fingerprint: req.Fingerprint, Owner: owner, Hold: hold})
	require.NoError(t, err)
	require.True(t, claimed)
	return rec
}

// expire moves the answer or release of key's row a day into the past, past
// its retention.
func (b *bundle) expire(t *testing.T, key string) {
	t.Helper()
	tag, err := b.pool.Exec(t.Context(), `UPDATE `+b.store.Table()+` SET completed_at = completed_at - interval '1 day',
		released_at = released_at - interval '1 day' WHERE key = $1`, key)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
}

func newRequest(key string) idem.Request {
	return idem.Request{Scope: "acme", Key: key, Fingerprint: idem.HashParts([]byte("POST /orders"), []byte(key))}
}

func guard(t *testing.T, st idem.Store) *idem.Guard {
	t.Helper()
	g, err := idem.New(st, nil)
	require.NoError(t, err)
	return g
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		nil, {"frobnicate"}, {"migrate"}, {"migrate", "sideways"}, {"inspect", "only-scope"},
		{"pending", "-limit", "0"}, {"settle", "acme", "k"}, {"release", "acme", "k", "-owner", "nope"},
		{"stats", "-table", "Bad-Name"},
	} {
		var out, errOut bytes.Buffer
		code := run(t.Context(), args, &out, &errOut)
		require.Equal(t, exitUsage, code, "idem %q: stderr %s", args, errOut.String())
		require.NotEmpty(t, errOut.String())
	}
	var out, errOut bytes.Buffer
	require.Equal(t, exitOK, run(t.Context(), []string{"help"}, &out, &errOut))
	require.Contains(t, out.String(), "migrate up")
}

// A server that does not answer is named, without the URL's password.
func TestUnreachable(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run(t.Context(), []string{"stats", "-database-url", "postgres://postgres:secret@127.0.0.1:1/nowhere?connect_timeout=2"}, &out, &errOut)
	require.Equal(t, exitFail, code)
	require.Contains(t, errOut.String(), "idem: connect to PostgreSQL at 127.0.0.1:1/nowhere: ")
	require.NotContains(t, errOut.String(), "secret")

	// $DATABASE_URL is the default, and -h does not print it.
	t.Setenv("DATABASE_URL", "postgres://postgres:secret@127.0.0.1:1/fromenv?connect_timeout=2")
	out.Reset()
	errOut.Reset()
	require.Equal(t, exitFail, run(t.Context(), []string{"stats"}, &out, &errOut))
	require.Contains(t, errOut.String(), "at 127.0.0.1:1/fromenv: ")
	errOut.Reset()
	require.Equal(t, exitOK, run(t.Context(), []string{"stats", "-h"}, &out, &errOut))
	require.Contains(t, errOut.String(), "-database-url")
	require.NotContains(t, errOut.String(), "secret")
}

func TestMigrate(t *testing.T) {
	pool := testdb.Pool(t)
	b := &bundle{pool: pool, schema: testdb.SchemaName(t, pool)}

	out, _, code := b.idem(t, "migrate", "status")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "1 migration(s) to apply: run `idem migrate up` with -schema "+b.schema)

	// Every other command says what is missing.
	_, errOut, code := b.idem(t, "stats")
	require.Equal(t, exitFail, code)
	require.Contains(t, errOut, "is not migrated (0 of 1 migrations applied): run `idem migrate up` with -schema "+b.schema)

	out, _, code = b.idem(t, "migrate", "up")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "applied migration(s) [1]")
	out, _, code = b.idem(t, "migrate", "up")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "up to date")
	out, _, code = b.idem(t, "migrate", "status", "-json")
	require.Equal(t, exitOK, code)
	var status struct {
		Status []migrationJSON `json:"status"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &status))
	require.Len(t, status.Status, 1)
	require.True(t, status.Status[0].Applied)

	// Down (only when told: the last migration drops the table) and up.
	_, errOut, code = b.idem(t, "migrate", "down")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "add -delete-keys")
	_, errOut, code = b.idem(t, "migrate", "down", "-to", "0")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "add -delete-keys")
	out, _, code = b.idem(t, "migrate", "down", "-to", "0", "-delete-keys")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "undid migration(s) [1]")
	var exists bool
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT to_regclass($1) IS NOT NULL", b.schema+".idempotency_keys").Scan(&exists))
	require.False(t, exists)
	_, errOut, code = b.idem(t, "inspect", "acme", "k")
	require.Equal(t, exitFail, code)
	require.Contains(t, errOut, "(0 of 1 migrations applied): run `idem migrate up`")

	out, _, code = b.idem(t, "migrate", "up")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "applied migration(s) [1]")
}

func TestInspect(t *testing.T) {
	b := setup(t)
	ctx := t.Context()

	_, errOut, code := b.idem(t, "inspect", "acme", "never")
	require.Equal(t, exitFail, code)
	require.Contains(t, errOut, "no row for key_hash "+idem.KeyHash("acme", "never"))

	// In progress and held.
	held := newRequest("held")
	rec := b.claim(t, held, time.Hour)
	out, _, code := b.idem(t, "inspect", "acme", "held")
	require.Equal(t, exitOK, code)
	for _, want := range []string{
		"key_hash     " + idem.KeyHash("acme", "held"),
		"in_progress (held by its execution)",
		"fingerprint  " + hex.EncodeToString(held.Fingerprint[:]),
		"owner        " + rec.Owner.String(),
		"attempt      1",
		"never expires while in progress; its answer will live 24h0m0s",
	} {
		require.Contains(t, out, want)
	}
	// An hour's hold, read on the database's clock.
	require.Regexp(t, `hold +(59m5\ds|1h0m0s) left, until `, out)

	// Answered, through a Guard: status, headers, body size; the body on
	// request.
	answered := newRequest("answered")
	_, outcome, err := guard(t, b.store).Do(ctx, answered, func(ctx context.Context) (idem.Response, error) {
		return idem.Response{Status: 201, Header: http.Header{"Location": {"/orders/1"}}, Body: []byte(`{"id":1}`)}, nil
	})
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, outcome)
	out, _, code = b.idem(t, "inspect", "acme", "answered", "-body")
	require.Equal(t, exitOK, code)
	for _, want := range []string{"state        answered", "status       201", "header       Location: /orders/1",
		"body         8 bytes", `{"id":1}`} {
		require.Contains(t, out, want)
	}
	require.Regexp(t, `retention +(23h59m5\ds|24h0m0s) left`, out)

	out, _, code = b.idem(t, "inspect", "acme", "answered", "-json")
	require.Equal(t, exitOK, code)
	var j keyJSON
	require.NoError(t, json.Unmarshal([]byte(out), &j))
	require.Equal(t, durable.StateAnswered, j.State)
	require.Equal(t, 201, j.Status)
	require.Equal(t, 8, j.BodySize)
	require.Nil(t, j.Body)
	require.NotNil(t, j.RetentionLeftMS)
	require.Greater(t, *j.RetentionLeftMS, int64(23*time.Hour/time.Millisecond))

	// Released, then expired: its retention has passed.
	released := newRequest("released")
	rec = b.claim(t, released, 0)
	require.NoError(t, b.store.Release(ctx, "acme", "released", rec.Owner))
	out, _, code = b.idem(t, "inspect", "acme", "released")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "state        released")
	b.expire(t, "released")
	out, _, code = b.idem(t, "inspect", "acme", "released")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "state        expired")
	require.Contains(t, out, "the next claim takes it over as a new intent")
}

func TestInspectLease(t *testing.T) {
	b := setup(t)
	rdb := testredis.Client(t)
	prefix := testredis.Prefix(t, rdb)
	locker, err := lock.New(rdb, &lock.Config{Prefix: prefix, Timeout: 5 * time.Second})
	require.NoError(t, err)
	g, err := idem.New(b.store, &idem.Config{Lock: locker})
	require.NoError(t, err)

	req := newRequest("leased")
	var out, errOut string
	var code int
	_, _, err = g.Do(t.Context(), req, func(ctx context.Context) (idem.Response, error) {
		// While the work runs, the lease names the request; inspect reads
		// it and changes nothing.
		out, errOut, code = b.idem(t, "inspect", "acme", "leased", "-redis", testredis.Addr(), "-lock-prefix", prefix, "-json")
		return idem.Response{Status: 201}, nil
	})
	require.NoError(t, err)
	require.Equal(t, exitOK, code, "stderr: %s", errOut)
	var j keyJSON
	require.NoError(t, json.Unmarshal([]byte(out), &j))
	require.Equal(t, durable.StateInProgress, j.State)
	require.NotNil(t, j.Lease)
	require.True(t, j.Lease.Found)
	require.Contains(t, []string{"claiming", "running"}, j.Lease.State)
	require.True(t, j.Lease.SameRequest)
	require.Equal(t, locker.Key("acme", "leased"), j.Lease.RedisKey)
	require.Positive(t, j.Lease.TTLMS)

	// Once answered, the lease holds a copy of the answer: the Guard writes
	// it without waiting, so wait for it to land.
	require.Eventually(t, func() bool {
		out, _, code = b.idem(t, "inspect", "acme", "leased", "-redis", testredis.Addr(), "-lock-prefix", prefix, "-json")
		j = keyJSON{}
		return code == exitOK && json.Unmarshal([]byte(out), &j) == nil && j.Lease != nil && j.Lease.State == "answer"
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, durable.StateAnswered, j.State)
	require.Equal(t, 201, j.Lease.Status)
	require.True(t, j.Lease.SameRequest)

	out, _, code = b.idem(t, "inspect", "acme", "nolease-but-row", "-redis", testredis.Addr(), "-lock-prefix", prefix)
	require.Equal(t, exitFail, code) // no row at all
	b.claim(t, newRequest("nolease"), 0)
	out, _, code = b.idem(t, "inspect", "acme", "nolease", "-redis", testredis.Addr(), "-lock-prefix", prefix)
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "lease        none at "+locker.Key("acme", "nolease"))
}

func TestPendingAndStats(t *testing.T) {
	b := setup(t)
	ctx := t.Context()

	out, _, code := b.idem(t, "pending")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "no key waits for reconciliation")

	first := b.claim(t, newRequest("first"), 0)
	second := b.claim(t, newRequest("second"), 0)
	b.claim(t, newRequest("held"), time.Hour) // not pending: still held
	_, _, err := guard(t, b.store).Do(ctx, newRequest("answered"), func(context.Context) (idem.Response, error) {
		return idem.Response{Status: 200}, nil
	})
	require.NoError(t, err)
	rel := b.claim(t, newRequest("released"), 0)
	require.NoError(t, b.store.Release(ctx, "acme", "released", rel.Owner))

	out, _, code = b.idem(t, "pending")
	require.Equal(t, exitOK, code)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out) // header, oldest first
	require.Contains(t, lines[1], first.Owner.String())
	require.Contains(t, lines[1], `"first"`)
	require.Contains(t, lines[2], second.Owner.String())

	out, _, code = b.idem(t, "pending", "-limit", "1", "-json")
	require.Equal(t, exitOK, code)
	var js []keyJSON
	require.NoError(t, json.Unmarshal([]byte(out), &js))
	require.Len(t, js, 1)
	require.Equal(t, "first", js[0].Key)
	require.True(t, js[0].Pending)

	out, _, code = b.idem(t, "stats")
	require.Equal(t, exitOK, code)
	for _, want := range []string{"in_progress           3", "  held                1", "  pending             2",
		"answered              1", "released              1", "expired               0"} {
		require.Contains(t, out, want)
	}
	b.expire(t, "answered")
	b.expire(t, "released")
	out, _, code = b.idem(t, "stats", "-json")
	require.Equal(t, exitOK, code)
	var n map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &n))
	require.EqualValues(t, 2, n["expired"]) // the answer and the release
	require.EqualValues(t, 0, n["answered"])
	require.EqualValues(t, 3, n["in_progress"]) // never expires
}

func TestSettle(t *testing.T) {
	b := setup(t)
	ctx := t.Context()
	t.Setenv("USER", "alice")
	req := newRequest("settle")
	rec := b.claim(t, req, 0)

	// The wrong owner: refused by the owner-checked write, nothing changes.
	var other idem.Token
	_, _ = rand.Read(other[:])
	_, errOut, code := b.idem(t, "settle", "acme", "settle", "-owner", other.String(), "-status", "201", "-body-text", "x")
	require.Equal(t, exitFail, code)
	require.Contains(t, errOut, "not the owner")
	require.Contains(t, errOut, "by=alice action=settle key_hash="+idem.KeyHash("acme", "settle"))
	require.Contains(t, errOut, "result=refused")
	row, err := b.store.Inspect(ctx, "acme", "settle")
	require.NoError(t, err)
	require.Equal(t, durable.StateInProgress, row.State)
	require.Nil(t, row.Answer)

	// A status that is never stored is refused.
	_, errOut, code = b.idem(t, "settle", "acme", "settle", "-owner", rec.Owner.String(), "-status", "503")
	require.Equal(t, exitFail, code)
	require.Contains(t, errOut, "cannot be stored")

	// The right owner: stored, and a retry through a Guard replays it.
	body := filepath.Join(t.TempDir(), "body.json")
	require.NoError(t, os.WriteFile(body, []byte(`{"id":"ord_1"}`), 0o600))
	out, errOut, code := b.idem(t, "settle", "acme", "settle", "-owner", rec.Owner.String(), "-status", "201",
		"-header", "Content-Type: application/json", "-header", "Location:/orders/ord_1", "-body", "@"+body, "-by", "bob")
	require.Equal(t, exitOK, code, "stderr: %s", errOut)
	require.Contains(t, out, "settled key_hash "+idem.KeyHash("acme", "settle"))
	require.Contains(t, errOut, `msg="idem: operator settle" by=bob action=settle`)
	require.Contains(t, errOut, "owner="+rec.Owner.String())
	require.Contains(t, errOut, "status=201")
	require.Contains(t, errOut, "result=ok")

	ran := false
	resp, outcome, err := guard(t, b.store).Do(ctx, req, func(context.Context) (idem.Response, error) {
		ran = true
		return idem.Response{Status: 500}, nil
	})
	require.NoError(t, err)
	require.False(t, ran)
	require.Equal(t, idem.OutcomeReplayed, outcome)
	require.Equal(t, 201, resp.Status)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	require.Equal(t, "/orders/ord_1", resp.Header.Get("Location"))
	require.Equal(t, `{"id":"ord_1"}`, string(resp.Body))

	// Settled once: a second settle is refused before any write.
	_, errOut, code = b.idem(t, "settle", "acme", "settle", "-owner", rec.Owner.String(), "-status", "200")
	require.Equal(t, exitFail, code)
	require.Contains(t, errOut, "the key is answered, not in progress")
}

func TestRelease(t *testing.T) {
	b := setup(t)
	ctx := t.Context()
	req := newRequest("release")
	rec := b.claim(t, req, 0)

	var other idem.Token
	_, _ = rand.Read(other[:])
	_, errOut, code := b.idem(t, "release", "acme", "release", "-owner", other.String(), "-by", "carol")
	require.Equal(t, exitFail, code)
	require.Contains(t, errOut, "not the owner")
	row, err := b.store.Inspect(ctx, "acme", "release")
	require.NoError(t, err)
	require.Equal(t, durable.StateInProgress, row.State)

	out, errOut, code := b.idem(t, "release", "acme", "release", "-owner", rec.Owner.String(), "-by", "carol")
	require.Equal(t, exitOK, code, "stderr: %s", errOut)
	require.Contains(t, out, "released key_hash "+idem.KeyHash("acme", "release"))
	require.Contains(t, errOut, "by=carol action=release")
	require.Contains(t, errOut, "result=ok")

	// The next claim runs the work, as attempt 2 of the same intent.
	var x idem.Execution
	_, outcome, err := guard(t, b.store).Do(ctx, req, func(ctx context.Context) (idem.Response, error) {
		x = idem.ExecutionFromContext(ctx)
		return idem.Response{Status: 201}, nil
	})
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, outcome)
	require.Equal(t, 2, x.Attempt)
	require.Equal(t, rec.Intent, x.Intent)
}

func TestHeldKeyIsRefused(t *testing.T) {
	b := setup(t)
	rec := b.claim(t, newRequest("held"), time.Hour)
	for _, args := range [][]string{
		{"settle", "acme", "held", "-owner", rec.Owner.String(), "-status", "201", "-by", "dave"},
		{"release", "acme", "held", "-owner", rec.Owner.String(), "-by", "dave"},
	} {
		_, errOut, code := b.idem(t, args...)
		require.Equal(t, exitFail, code)
		require.Contains(t, errOut, "still held by its execution")
		require.Contains(t, errOut, "result=refused")
	}
	row, err := b.store.Inspect(t.Context(), "acme", "held")
	require.NoError(t, err)
	require.Equal(t, durable.StateInProgress, row.State)
	require.True(t, row.Held())
	require.Equal(t, rec.Owner, row.Owner)
}

func TestMigratePartitioned(t *testing.T) {
	pool := testdb.Pool(t)
	b := &bundle{pool: pool, schema: testdb.SchemaName(t, pool)}
	out, errOut, code := b.idem(t, "migrate", "up", "-partitions", "4")
	require.Equal(t, exitOK, code, "stderr: %s", errOut)
	require.Contains(t, out, "applied migration(s) [1]")
	// An existing table is never laid out again: the command says so.
	_, errOut, code = b.idem(t, "migrate", "up")
	require.Equal(t, exitFail, code)
	require.Contains(t, errOut, "is partitioned into 4 but Config.Partitions is 0")
	_, _, code = b.idem(t, "stats")
	require.Equal(t, exitOK, code)
}

// A scope or key that starts with '-' goes after "--".
func TestDashedKey(t *testing.T) {
	b := setup(t)
	rec := b.claim(t, idem.Request{Scope: "-acme", Key: "-k", Fingerprint: idem.HashParts([]byte("x"))}, 0)
	out, errOut, code := b.idem(t, "inspect", "-json", "--", "-acme", "-k")
	require.Equal(t, exitOK, code, "stderr: %s", errOut)
	var j keyJSON
	require.NoError(t, json.Unmarshal([]byte(out), &j))
	require.Equal(t, rec.Owner.String(), j.Owner)
}

// With -notify, a settle announces the key as a Store with Config.Notify
// does: a retry waiting for it through a Listener wakes.
func TestSettleNotifies(t *testing.T) {
	b := setup(t)
	st, err := durable.New(b.pool, &durable.Config{Schema: b.schema, Notify: true})
	require.NoError(t, err)
	l, err := durable.NewListener(t.Context(), st)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	rec := b.claim(t, newRequest("waited"), 0)
	wake, cancel := l.Subscribe("acme", "waited")
	defer cancel()

	_, errOut, code := b.idem(t, "settle", "acme", "waited", "-owner", rec.Owner.String(), "-status", "200", "-by", "erin", "-notify")
	require.Equal(t, exitOK, code, "stderr: %s", errOut)
	select {
	case <-wake:
	case <-time.After(10 * time.Second):
		t.Fatal("the settle was not announced")
	}
}
