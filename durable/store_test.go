package durable_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/testdb"
)

func TestClaim(t *testing.T) {
	t.Run("wins on a new key", func(t *testing.T) {
		b := setup(t, nil)
		p := params(t, "user-1", "key-1", "a")
		rec := b.claim(t, p)
		require.Equal(t, "user-1", rec.Scope)
		require.Equal(t, "key-1", rec.Key)
		require.Equal(t, p.Fingerprint, rec.Fingerprint)
		require.Equal(t, p.Owner, rec.Owner)
		require.True(t, rec.InProgress())
		require.False(t, rec.CreatedAt.IsZero())
		require.True(t, rec.CompletedAt.IsZero())
	})

	t.Run("loses to an in-progress row and gets it back", func(t *testing.T) {
		b := setup(t, nil)
		first := b.claim(t, params(t, "user-1", "key-1", "a"))

		rec, claimed, err := b.store.Claim(b.ctx, params(t, "user-1", "key-1", "b"))
		require.NoError(t, err)
		require.False(t, claimed)
		require.Equal(t, row(first), row(rec))
		require.Equal(t, fingerprint("a"), rec.Fingerprint)
	})

	t.Run("loses to a finished row and gets its answer byte for byte", func(t *testing.T) {
		b := setup(t, nil)
		p := params(t, "user-1", "key-1", "a")
		b.claim(t, p)
		answer := idem.Response{
			Status: http.StatusCreated,
			Header: http.Header{
				"Content-Type": {"application/json"},
				"Set-Cookie":   {"a=1", "b=2"},
				"X-Unicode":    {"héllo ✓"},
			},
			Body: []byte{0x00, 0xff, '{', '}', 0x80, '\n'},
		}
		require.NoError(t, b.store.Complete(b.ctx, p.Scope, p.Key, p.Owner, answer))

		rec, claimed, err := b.store.Claim(b.ctx, params(t, "user-1", "key-1", "a"))
		require.NoError(t, err)
		require.False(t, claimed)
		require.Equal(t, p.Owner, rec.Owner)
		require.False(t, rec.InProgress())
		require.Equal(t, answer, *rec.Answer)
		require.False(t, rec.CompletedAt.IsZero())
		require.False(t, rec.CompletedAt.Before(rec.CreatedAt))
	})

	t.Run("scopes are independent", func(t *testing.T) {
		b := setup(t, nil)
		b.claim(t, params(t, "user-1", "key-1", "a"))
		rec := b.claim(t, params(t, "user-2", "key-1", "b"))
		require.Equal(t, "user-2", rec.Scope)
		require.Equal(t, fingerprint("b"), rec.Fingerprint)
	})

	t.Run("takes over an expired row", func(t *testing.T) {
		b := setup(t, nil)
		old := params(t, "user-1", "key-1", "a")
		b.claim(t, old)
		require.NoError(t, b.store.Complete(b.ctx, old.Scope, old.Key, old.Owner, idem.Response{Status: 200}))
		b.age(t, "user-1", "key-1", "25 hours")

		p := params(t, "user-1", "key-1", "b")
		rec := b.claim(t, p)
		require.Equal(t, p.Fingerprint, rec.Fingerprint)
		require.Equal(t, p.Owner, rec.Owner)
		require.True(t, rec.InProgress())
		require.True(t, rec.CompletedAt.IsZero())
		require.WithinDuration(t, time.Now(), rec.CreatedAt, time.Hour) // reset, not 25h old
		require.Equal(t, 1, b.count(t))
	})

	t.Run("does not take over a row just inside retention", func(t *testing.T) {
		b := setup(t, nil)
		first := b.claim(t, params(t, "user-1", "key-1", "a"))
		b.age(t, "user-1", "key-1", "23 hours 59 minutes")

		rec, claimed, err := b.store.Claim(b.ctx, params(t, "user-1", "key-1", "b"))
		require.NoError(t, err)
		require.False(t, claimed)
		require.Equal(t, first.Owner, rec.Owner)
	})

	t.Run("honours a custom retention", func(t *testing.T) {
		b := setup(t, &durable.Config{Retention: time.Minute})
		p := params(t, "user-1", "key-1", "a")
		b.claim(t, p)
		require.NoError(t, b.store.Complete(b.ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 201}))
		b.age(t, "user-1", "key-1", "61 seconds")
		b.claim(t, params(t, "user-1", "key-1", "b"))
	})

	t.Run("refuses bad arguments", func(t *testing.T) {
		b := setup(t, nil)
		for name, p := range map[string]idem.ClaimParams{
			"NUL in key":    {Scope: "u", Key: "a\x00b", Owner: token(t)},
			"NUL in scope":  {Scope: "\x00", Key: "k", Owner: token(t)},
			"invalid UTF-8": {Scope: "u", Key: "\xff", Owner: token(t)},
			"zero owner":    {Scope: "u", Key: "k"},
		} {
			_, _, err := b.store.Claim(b.ctx, p)
			require.ErrorIs(t, err, idem.ErrInvalid, name)
		}
		require.Equal(t, 0, b.count(t))
	})
}

// TestClaimRace races 64 claimers on one key: exactly one wins and every
// other one gets the winner's row back, without an error.
func TestClaimRace(t *testing.T) {
	b := setup(t, nil)
	const n = 64
	var (
		start   = make(chan struct{})
		wg      sync.WaitGroup
		records [n]idem.Record
		claimed [n]bool
		errs    [n]error
	)
	for i := range n {
		wg.Go(func() {
			<-start
			p := params(t, "user-1", "hot-key", fmt.Sprint("body-", i))
			records[i], claimed[i], errs[i] = b.store.Claim(b.ctx, p)
		})
	}
	close(start)
	wg.Wait()

	winner := -1
	for i := range n {
		require.NoError(t, errs[i])
		if claimed[i] {
			require.Equal(t, -1, winner, "two claims won")
			winner = i
		}
	}
	require.NotEqual(t, -1, winner, "no claim won")
	for i := range n {
		require.Equal(t, row(records[winner]), row(records[i]))
	}
	require.Equal(t, 1, b.count(t))
}

// TestClaimReleaseRace mixes claims with releases so that the row often
// vanishes between Claim's statement and its fallback read: Claim must still
// never fail nor report two live owners at once.
func TestClaimReleaseRace(t *testing.T) {
	b := setup(t, nil)
	const workers, rounds = 16, 20
	var wg sync.WaitGroup
	errs := make(chan error, workers*rounds)
	for range workers {
		wg.Go(func() {
			for range rounds {
				p := params(t, "user-1", "churn", "a")
				_, claimed, err := b.store.Claim(b.ctx, p)
				if err != nil {
					errs <- err
					continue
				}
				if claimed {
					if err := b.store.Release(b.ctx, p.Scope, p.Key, p.Owner); err != nil {
						errs <- err
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		// The bounded retry may give up under this much churn; nothing
		// else may go wrong.
		require.ErrorContains(t, err, "gave up after 3 attempts")
	}
}

func TestGet(t *testing.T) {
	b := setup(t, nil)
	p := params(t, "user-1", "key-1", "a")
	claimedRec := b.claim(t, p)

	rec, err := b.store.Get(b.ctx, "user-1", "key-1")
	require.NoError(t, err)
	require.Equal(t, row(claimedRec), row(rec))

	_, err = b.store.Get(b.ctx, "user-1", "other")
	require.ErrorIs(t, err, idem.ErrNotFound)
	_, err = b.store.Get(b.ctx, "user-2", "key-1")
	require.ErrorIs(t, err, idem.ErrNotFound)

	b.age(t, "user-1", "key-1", "25 hours")
	rec, err = b.store.Get(b.ctx, "user-1", "key-1")
	require.NoError(t, err, "a row in progress never expires")
	require.Equal(t, claimedRec.Owner, rec.Owner)

	require.NoError(t, b.store.Complete(b.ctx, "user-1", "key-1", claimedRec.Owner, idem.Response{Status: 201}))
	b.age(t, "user-1", "key-1", "50 hours") // answered 25 hours ago
	_, err = b.store.Get(b.ctx, "user-1", "key-1")
	require.ErrorIs(t, err, idem.ErrNotFound, "an expired row is not found, swept or not")
	require.Equal(t, 1, b.count(t))
}

// TestCompleteRetryAfterLostReply: a Complete that committed but whose reply
// was lost is retried by its owner; the retry finds its own answer and
// succeeds, while another answer, or another owner, is still refused.
func TestCompleteRetryAfterLostReply(t *testing.T) {
	b := setup(t, nil)
	answer := idem.Response{Status: 201, Header: http.Header{"Location": {"/orders/1"}, "X-Empty": {}}, Body: []byte(`{"id":1}`)}
	p := params(t, "user-1", "key-1", "a")
	b.claim(t, p)
	require.NoError(t, b.store.Complete(b.ctx, p.Scope, p.Key, p.Owner, answer))

	same := answer
	same.Header = http.Header{"Location": {"/orders/1"}} // an empty list is stored as none
	require.NoError(t, b.store.Complete(b.ctx, p.Scope, p.Key, p.Owner, same))

	other := answer
	other.Body = []byte(`{"id":2}`)
	require.ErrorIs(t, b.store.Complete(b.ctx, p.Scope, p.Key, p.Owner, other), idem.ErrCompleted)
	other = answer
	other.Header = http.Header{"Location": {"/orders/2"}}
	require.ErrorIs(t, b.store.Complete(b.ctx, p.Scope, p.Key, p.Owner, other), idem.ErrCompleted)
	require.ErrorIs(t, b.store.Complete(b.ctx, p.Scope, p.Key, token(t), answer), idem.ErrNotOwner)

	rec, err := b.store.Get(b.ctx, p.Scope, p.Key)
	require.NoError(t, err)
	require.True(t, rec.Answer.Equal(answer))
}

// lostTakeoverReplyDB runs the store's statements, but reports the first
// takeover of an expired row as failed after it has committed: the reply to
// a committed write is lost.
type lostTakeoverReplyDB struct {
	durable.DB
	lost bool
}

func (d *lostTakeoverReplyDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if !d.lost && strings.Contains(sql, "reconcile_attempts = 0") {
		d.lost = true
		if _, err := d.DB.Exec(ctx, sql, args...); err != nil {
			return errRow{err}
		}
		return errRow{errors.New("read tcp: connection reset by peer")}
	}
	return d.DB.QueryRow(ctx, sql, args...)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// A key reused after its retention whose takeover commits but whose reply is
// lost: that Claim fails and wins nothing, and every later Claim finds the
// new intent's row in progress. The expired answer is never returned again,
// and the key is never won twice.
func TestTakeoverLostReply(t *testing.T) {
	b := setup(t, nil)
	old := params(t, "user-1", "key-1", "a")
	b.claim(t, old)
	require.NoError(t, b.store.Complete(b.ctx, old.Scope, old.Key, old.Owner, idem.Response{Status: 201, Body: []byte("old order")}))
	b.age(t, old.Scope, old.Key, "25 hours")

	lossy := b.store.WithDB(&lostTakeoverReplyDB{DB: b.pool})
	next := params(t, "user-1", "key-1", "a")
	_, claimed, err := lossy.Claim(b.ctx, next)
	require.ErrorContains(t, err, "connection reset")
	require.False(t, claimed)

	retry := params(t, "user-1", "key-1", "a")
	rec, claimed, err := b.store.Claim(b.ctx, retry)
	require.NoError(t, err)
	require.False(t, claimed, "the committed takeover holds the key")
	require.True(t, rec.InProgress(), "not the expired answer")
	require.Equal(t, next.Owner, rec.Owner, "owned by the request whose reply was lost")
	require.Equal(t, 1, b.count(t))
}

func TestAnswerEqual(t *testing.T) {
	a := idem.Response{Status: 200, Header: http.Header{"A": {"1", "2"}}, Body: []byte("x")}
	for _, c := range []struct {
		b    idem.Response
		want bool
	}{
		{a, true},
		{idem.Response{Status: 200, Header: http.Header{"A": {"1", "2"}, "B": nil}, Body: []byte("x")}, true},
		{idem.Response{Status: 201, Header: a.Header, Body: a.Body}, false},
		{idem.Response{Status: 200, Header: http.Header{"A": {"2", "1"}}, Body: a.Body}, false},
		{idem.Response{Status: 200, Header: http.Header{"A": {"1", "2"}, "B": {"3"}}, Body: a.Body}, false},
		{idem.Response{Status: 200, Header: a.Header}, false},
	} {
		require.Equal(t, c.want, a.Equal(c.b), "%v", c.b)
		require.Equal(t, c.want, c.b.Equal(a), "symmetric: %v", c.b)
	}
	require.True(t, idem.Response{Status: 204}.Equal(idem.Response{Status: 204, Header: http.Header{}, Body: []byte{}}))
}

func TestComplete(t *testing.T) {
	answer := idem.Response{Status: 200, Header: http.Header{"X-A": {"1"}}, Body: []byte("ok")}

	t.Run("by the owner", func(t *testing.T) {
		b := setup(t, nil)
		p := params(t, "user-1", "key-1", "a")
		claimedRec := b.claim(t, p)
		require.NoError(t, b.store.Complete(b.ctx, p.Scope, p.Key, p.Owner, answer))

		rec, err := b.store.Get(b.ctx, p.Scope, p.Key)
		require.NoError(t, err)
		require.Equal(t, answer, *rec.Answer)
		require.Equal(t, claimedRec.CreatedAt, rec.CreatedAt)
		require.False(t, rec.CompletedAt.Before(rec.CreatedAt))
	})

	tests := []struct {
		name    string
		prepare func(t *testing.T, b *bundle, p idem.ClaimParams) idem.Token // returns the token to complete with
		want    error
	}{
		{
			name: "by another owner",
			prepare: func(t *testing.T, b *bundle, p idem.ClaimParams) idem.Token {
				b.claim(t, p)
				return token(t)
			},
			want: idem.ErrNotOwner,
		},
		{
			name: "twice",
			prepare: func(t *testing.T, b *bundle, p idem.ClaimParams) idem.Token {
				b.claim(t, p)
				require.NoError(t, b.store.Complete(b.ctx, p.Scope, p.Key, p.Owner, answer))
				return p.Owner
			},
			want: idem.ErrCompleted,
		},
		{
			name: "missing",
			prepare: func(t *testing.T, b *bundle, p idem.ClaimParams) idem.Token {
				return p.Owner
			},
			want: idem.ErrNotFound,
		},
		{
			name: "released",
			prepare: func(t *testing.T, b *bundle, p idem.ClaimParams) idem.Token {
				b.claim(t, p)
				require.NoError(t, b.store.Release(b.ctx, p.Scope, p.Key, p.Owner))
				return p.Owner
			},
			want: idem.ErrNotFound,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := setup(t, nil)
			p := params(t, "user-1", "key-1", "a")
			owner := tt.prepare(t, b, p)
			before, beforeErr := b.store.Get(b.ctx, p.Scope, p.Key)

			err := b.store.Complete(b.ctx, p.Scope, p.Key, owner, idem.Response{Status: 500})
			require.ErrorIs(t, err, tt.want)

			after, afterErr := b.store.Get(b.ctx, p.Scope, p.Key)
			require.Equal(t, beforeErr, afterErr)
			require.Equal(t, row(before), row(after), "nothing written")
		})
	}

	t.Run("bad status", func(t *testing.T) {
		b := setup(t, nil)
		p := params(t, "user-1", "key-1", "a")
		b.claim(t, p)
		err := b.store.Complete(b.ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 42})
		require.ErrorIs(t, err, idem.ErrInvalid)
	})

	t.Run("NUL in a header is refused by the database", func(t *testing.T) {
		b := setup(t, nil)
		p := params(t, "user-1", "key-1", "a")
		b.claim(t, p)
		err := b.store.Complete(b.ctx, p.Scope, p.Key, p.Owner,
			idem.Response{Status: 200, Header: http.Header{"X-Bad": {"a\x00b"}}})
		require.ErrorIs(t, err, idem.ErrInvalid)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "22P05", pgErr.Code)

		rec, err := b.store.Get(b.ctx, p.Scope, p.Key)
		require.NoError(t, err)
		require.True(t, rec.InProgress())
	})
}

func TestRelease(t *testing.T) {
	tests := []struct {
		name string
		// prepare returns the owner to release with.
		prepare func(t *testing.T, b *bundle, p idem.ClaimParams) idem.Token
		want    error // nil: released
	}{
		{
			name: "by the owner",
			prepare: func(t *testing.T, b *bundle, p idem.ClaimParams) idem.Token {
				b.claim(t, p)
				return p.Owner
			},
		},
		{
			name: "by another owner",
			prepare: func(t *testing.T, b *bundle, p idem.ClaimParams) idem.Token {
				b.claim(t, p)
				return token(t)
			},
			want: idem.ErrNotOwner,
		},
		{
			name: "finished",
			prepare: func(t *testing.T, b *bundle, p idem.ClaimParams) idem.Token {
				b.claim(t, p)
				require.NoError(t, b.store.Complete(b.ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 200}))
				return p.Owner
			},
			want: idem.ErrCompleted,
		},
		{
			name: "missing",
			prepare: func(t *testing.T, b *bundle, p idem.ClaimParams) idem.Token {
				return p.Owner
			},
			want: idem.ErrNotFound,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := setup(t, nil)
			p := params(t, "user-1", "key-1", "a")
			owner := tt.prepare(t, b, p)
			rows := b.count(t)

			err := b.store.Release(b.ctx, p.Scope, p.Key, owner)
			if tt.want != nil {
				require.ErrorIs(t, err, tt.want)
				require.Equal(t, rows, b.count(t), "nothing deleted")
				return
			}
			require.NoError(t, err)
			_, err = b.store.Get(b.ctx, p.Scope, p.Key)
			require.ErrorIs(t, err, idem.ErrNotFound, "no claim holds a released key")
			require.Equal(t, 1, b.count(t), "the row keeps the intent")
			// A retry is safe: the next claim wins.
			b.claim(t, params(t, p.Scope, p.Key, "a"))
		})
	}
}

// TestWithDB runs Complete in a caller's transaction: the answer is stored
// only if that transaction commits.
func TestWithDB(t *testing.T) {
	for _, commit := range []bool{false, true} {
		t.Run(fmt.Sprint("commit=", commit), func(t *testing.T) {
			b := setup(t, nil)
			p := params(t, "user-1", "key-1", "a")
			b.claim(t, p)

			tx, err := b.pool.Begin(b.ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(context.WithoutCancel(b.ctx)) }()
			txStore := b.store.WithDB(tx)
			require.Equal(t, b.store.Table(), txStore.Table())
			require.NoError(t, txStore.Complete(b.ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 201}))

			// Inside the transaction the row is finished; outside, not yet.
			rec, err := txStore.Get(b.ctx, p.Scope, p.Key)
			require.NoError(t, err)
			require.False(t, rec.InProgress())
			rec, err = b.store.Get(b.ctx, p.Scope, p.Key)
			require.NoError(t, err)
			require.True(t, rec.InProgress())

			if commit {
				require.NoError(t, tx.Commit(b.ctx))
			} else {
				require.NoError(t, tx.Rollback(b.ctx))
			}
			rec, err = b.store.Get(b.ctx, p.Scope, p.Key)
			require.NoError(t, err)
			require.Equal(t, !commit, rec.InProgress())
		})
	}
}

func TestInvalidText(t *testing.T) {
	b := setup(t, nil)
	owner := token(t)
	answer := idem.Response{Status: 200}
	calls := map[string]func(scope, key string) error{
		"claim": func(scope, key string) error {
			_, _, err := b.store.Claim(b.ctx, idem.ClaimParams{Scope: scope, Key: key, Owner: owner})
			return err
		},
		"get": func(scope, key string) error {
			_, err := b.store.Get(b.ctx, scope, key)
			return err
		},
		"complete": func(scope, key string) error { return b.store.Complete(b.ctx, scope, key, owner, answer) },
		"release":  func(scope, key string) error { return b.store.Release(b.ctx, scope, key, owner) },
	}
	for name, call := range calls {
		require.ErrorIs(t, call("user-1", "key\x00"), idem.ErrInvalid, name)
		require.ErrorIs(t, call("user\x00", "key"), idem.ErrInvalid, name)
	}
}

// TestForeignRows: the table has no CHECK constraints, so
// a writer other than the store could leave rows they would have refused.
// The store never turns one into a decision or an overwrite: a fingerprint
// or owner of the wrong length is an error, and "answered" is read from
// response_status alone.
func TestForeignRows(t *testing.T) {
	b := setup(t, nil)
	insert := func(key, hash, owner string, status *int, completed bool) {
		t.Helper()
		_, err := b.pool.Exec(b.ctx, `INSERT INTO `+b.store.Table()+`
(user_id, key, request_hash, owner_token, hold_until, retention, response_status, completed_at)
VALUES ('user-1', $1, decode($2, 'hex'), decode($3, 'hex'), now(), interval '1 hour', $4, CASE WHEN $5 THEN now() END)`,
			key, hash, owner, status, completed)
		require.NoError(t, err)
	}
	hash32, owner16 := strings.Repeat("ab", 32), strings.Repeat("cd", 16)
	insert("short-hash", hash32[2:], owner16, nil, false)
	insert("short-owner", hash32, owner16[2:], nil, false)
	for _, key := range []string{"short-hash", "short-owner"} {
		_, claimed, err := b.store.Claim(b.ctx, params(t, "user-1", key, "a"))
		require.ErrorContains(t, err, "byte", key)
		require.NotErrorIs(t, err, idem.ErrNotFound, key)
		require.False(t, claimed, key)
		_, err = b.store.Get(b.ctx, "user-1", key)
		require.ErrorContains(t, err, "byte", key)
	}

	// An answer without completed_at is an answer: replayed, never
	// overwritten by its owner's Complete.
	owner, err := hex.DecodeString(owner16)
	require.NoError(t, err)
	tok := idem.Token(owner)
	status := 402
	insert("answered", hash32, owner16, &status, false)
	rec, err := b.store.Get(b.ctx, "user-1", "answered")
	require.NoError(t, err)
	require.False(t, rec.InProgress())
	require.Equal(t, 402, rec.Answer.Status)
	require.ErrorIs(t, b.store.Complete(b.ctx, "user-1", "answered", tok, idem.Response{Status: 201}), idem.ErrCompleted)
	require.ErrorIs(t, b.store.Release(b.ctx, "user-1", "answered", tok), idem.ErrCompleted)
	rec, err = b.store.Get(b.ctx, "user-1", "answered")
	require.NoError(t, err)
	require.Equal(t, 402, rec.Answer.Status)

	// A completed_at without an answer is still in progress: its owner
	// can store the answer.
	insert("unanswered", hash32, owner16, nil, true)
	rec, err = b.store.Get(b.ctx, "user-1", "unanswered")
	require.NoError(t, err)
	require.True(t, rec.InProgress())
	require.NoError(t, b.store.Complete(b.ctx, "user-1", "unanswered", tok, idem.Response{Status: 201}))
	rec, err = b.store.Get(b.ctx, "user-1", "unanswered")
	require.NoError(t, err)
	require.Equal(t, 201, rec.Answer.Status)
}

func TestSweep(t *testing.T) {
	// seed inserts n answered rows under scope, created and answered the
	// given interval ago.
	seed := func(t *testing.T, b *bundle, scope string, n int, ago string) {
		t.Helper()
		_, err := b.pool.Exec(b.ctx, `
INSERT INTO `+b.store.Table()+` (user_id, key, request_hash, owner_token, response_status, response_headers,
	response_body, created_at, completed_at, hold_until, retention)
SELECT $1, 'key-' || g, sha256(g::text::bytea), decode(md5(g::text), 'hex'), 201, '{}', '',
	now() - $3::interval, now() - $3::interval, now() - $3::interval, `+retentionSQL(b.store)+`
FROM generate_series(1, $2::int) AS g`, scope, n, ago)
		require.NoError(t, err)
	}

	t.Run("deletes only expired rows, in batches", func(t *testing.T) {
		b := setup(t, nil)
		seed(t, b, "expired", 2500, "25 hours")
		seed(t, b, "live", 10, "23 hours")
		b.claim(t, params(t, "live", "fresh", "a"))
		// A key in progress for longer than the retention never expires:
		// its outcome is unknown.
		b.claim(t, params(t, "live", "unanswered", "a"))
		b.age(t, "live", "unanswered", "48 hours")

		n, err := b.sweep(t, b.ctx, 1000)
		require.NoError(t, err)
		require.EqualValues(t, 2500, n)
		require.Equal(t, 12, b.count(t))
		var expired int
		require.NoError(t, b.pool.QueryRow(b.ctx,
			`SELECT count(*) FROM `+b.store.Table()+` WHERE user_id = 'expired'`).Scan(&expired))
		require.Zero(t, expired)

		n, err = b.sweep(t, b.ctx, 1000)
		require.NoError(t, err)
		require.Zero(t, n)
	})

	t.Run("cancelled", func(t *testing.T) {
		b := setup(t, nil)
		seed(t, b, "expired", 100, "25 hours")
		ctx, cancel := context.WithCancel(b.ctx)
		cancel()
		n, err := b.sweep(t, ctx, 10)
		require.ErrorIs(t, err, context.Canceled)
		require.Zero(t, n)
		require.Equal(t, 100, b.count(t))
	})
}

// TestDatabaseClock checks that created_at and completed_at are the
// database's now(), not the application's clock.
func TestDatabaseClock(t *testing.T) {
	b := setup(t, nil)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(b.ctx)) }()

	// now() is fixed for a transaction: a row written through it must carry
	// exactly that time, whatever the application's clock says.
	var dbNow time.Time
	require.NoError(t, tx.QueryRow(b.ctx, "SELECT now()").Scan(&dbNow))
	s := b.store.WithDB(tx)
	p := params(t, "user-1", "key-1", "a")
	rec, claimed, err := s.Claim(b.ctx, p)
	require.NoError(t, err)
	require.True(t, claimed)
	require.True(t, dbNow.Equal(rec.CreatedAt), "created_at %v, now() %v", rec.CreatedAt, dbNow)

	require.NoError(t, s.Complete(b.ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 200}))
	rec, err = s.Get(b.ctx, p.Scope, p.Key)
	require.NoError(t, err)
	require.True(t, dbNow.Equal(rec.CompletedAt))
}

func TestContextErrors(t *testing.T) {
	b := setup(t, nil)
	ctx, cancel := context.WithCancel(b.ctx)
	cancel()
	_, _, err := b.store.Claim(ctx, params(t, "user-1", "key-1", "a"))
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, errors.Is(err, idem.ErrNotFound))

	ctx, cancel = context.WithDeadline(b.ctx, time.Now().Add(-time.Second))
	defer cancel()
	_, err = b.store.Get(ctx, "user-1", "key-1")
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// row is rec without its TTL and Age, which each read measures anew: two
// reads of an unchanged row differ only in them.
func row(rec idem.Record) idem.Record {
	rec.TTL, rec.Age = 0, 0
	return rec
}

// Every record tells how long its row still lives, on the database's clock:
// the retention at the claim, less the row's age on every later read.
func TestRecordTTL(t *testing.T) {
	b := setup(t, &durable.Config{Retention: time.Hour})
	p := params(t, "user-1", "key-1", "a")
	rec := b.claim(t, p)
	require.LessOrEqual(t, rec.TTL, time.Hour)
	require.Greater(t, rec.TTL, time.Hour-time.Minute)

	// In progress, the row never expires: its answer will live at least the
	// retention.
	b.age(t, p.Scope, p.Key, "2 hours")
	got, err := b.store.Get(b.ctx, p.Scope, p.Key)
	require.NoError(t, err)
	require.Equal(t, time.Hour, got.TTL)

	// Answered, it lives the retention from its answer.
	require.NoError(t, b.store.Complete(b.ctx, p.Scope, p.Key, p.Owner, idem.Response{Status: 201}))
	b.age(t, p.Scope, p.Key, "2 hours 40 minutes") // answered about 40 minutes ago
	got, err = b.store.Get(b.ctx, p.Scope, p.Key)
	require.NoError(t, err)
	require.LessOrEqual(t, got.TTL, 20*time.Minute+time.Second)
	require.Greater(t, got.TTL, 19*time.Minute)

	lost, claimed, err := b.store.Claim(b.ctx, params(t, "user-1", "key-1", "a"))
	require.NoError(t, err)
	require.False(t, claimed)
	require.LessOrEqual(t, lost.TTL, 20*time.Minute+time.Second)
	require.Greater(t, lost.TTL, 19*time.Minute)
}

// A store on a schema that was never migrated says what to run.
func TestUnmigratedSchemaNamesMigrate(t *testing.T) {
	pool := testdb.Pool(t)
	store, err := durable.New(pool, &durable.Config{Schema: "idem_never_migrated_" + strings.ToLower(rand.Text())})
	require.NoError(t, err)
	_, _, err = store.Claim(t.Context(), params(t, "user-1", "k", "{}"))
	require.ErrorContains(t, err, "durable: claim: the schema lacks a table or column of this build: run durable.Migrate: ")
	require.ErrorContains(t, err, "SQLSTATE 42P01")
}
