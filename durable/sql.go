package durable

import (
	"strconv"
	"strings"
)

// columns is the select list every statement that returns rows uses, in the
// order scanRecord reads them. now() is the database's clock at the
// statement, from which the Store tells how long the row still lives
// (Record.TTL) without comparing it with any host's clock.
const columns = `user_id, key, request_hash, owner_token, response_status,
	response_headers, response_body, created_at, completed_at, now()`

// statements holds every SQL statement of a Store, built once by New for its
// table. Each is one round trip.
type statements struct {
	claim, takeover, get, release string
	releaseNotify                 string
	inspect, sweepBatch           string
	// complete is the answer write, as its own transaction;
	// completeNotify announces it too. completeIn and completeInNotify are
	// the same writes inside a caller's transaction (Store.WithDB).
	complete, completeNotify     string
	completeIn, completeInNotify string
}

// newStatements builds the statements for the quoted, qualified table name t.
//
// The retention is always a parameter in microseconds, turned into an
// interval by the database: a row is live while
// created_at >= now() - retention, and expired after.
func newStatements(t string) *statements {
	r := strings.NewReplacer(
		"{t}", t,
		"{cols}", columns,
	)
	st := &statements{
		// $1 scope, $2 key, $3 fingerprint, $4 owner, $5 retention.
		//
		// ins inserts the row when there is none; otherwise the second
		// branch returns the row that stopped it, with a last column that
		// says whether it has expired. A new key costs what the bare INSERT
		// costs: one primary-key probe (ON CONFLICT's pre-check) and the
		// insert. When the key is taken (a replay, a retry in progress, a
		// reused key) the INSERT writes and locks nothing: ON CONFLICT DO
		// NOTHING skips on its pre-check, so a lost claim is a plain read,
		// with no transaction id, no WAL and no commit flush. (ON CONFLICT
		// DO UPDATE ... WHERE expired would lock the live row, a WAL
		// write.) An expired row is taken over by the takeover statement,
		// a second round trip that only a key reused after its retention
		// and before the sweeper's pass pays.
		//
		// Under READ COMMITTED the second branch reads the statement's
		// snapshot, so a row another claimer committed after it started
		// is not seen: the statement then returns no row and Claim falls
		// back to Get.
		claim: r.Replace(`
WITH ins AS (
	INSERT INTO {t} (user_id, key, request_hash, owner_token)
	VALUES ($1, $2, $3, $4)
	ON CONFLICT (user_id, key) DO NOTHING
	RETURNING {cols}
)
SELECT {cols}, true AS claimed, false AS expired FROM ins
UNION ALL
SELECT {cols}, false, created_at < now() - $5::bigint * interval '1 microsecond' FROM {t}
WHERE user_id = $1 AND key = $2 AND NOT EXISTS (SELECT 1 FROM ins)`),

		// $1 scope, $2 key, $3 fingerprint, $4 owner, $5 retention.
		//
		// Takes over the expired row of a key: a new intent, with no
		// answer and a fresh created_at, as if the row had been deleted
		// and inserted again. Two takeovers of one expired row serialise
		// on its row lock; the second re-checks the WHERE against the new
		// version, finds it live, and updates nothing.
		//
		// Expiry is stated as created_at + retention < now(), which no
		// index on created_at can serve: otherwise a planner that expects
		// no expired rows could pick that index (TestPlansUseThePrimaryKey
		// saw it on a small table) and walk every expired row still waiting
		// for the sweeper.
		takeover: r.Replace(`
UPDATE {t} SET
	request_hash       = $3,
	owner_token        = $4,
	response_status    = NULL,
	response_headers   = NULL,
	response_body      = NULL,
	created_at         = now(),
	completed_at       = NULL,
	reconcile_attempts = 0,
	reconcile_after    = NULL
WHERE user_id = $1 AND key = $2 AND created_at + $5::bigint * interval '1 microsecond' < now()
RETURNING {cols}`),

		// $1 scope, $2 key, $3 retention.
		get: r.Replace(`
SELECT {cols} FROM {t}
WHERE user_id = $1 AND key = $2 AND created_at >= now() - $3::bigint * interval '1 microsecond'`),

		// The answer write inside a caller's transaction (Store.WithDB),
		// or with Config.SynchronousAnswers: see completeSQL.
		completeIn: r.Replace(completeSQL),

		// The same write as its own transaction, which it commits
		// without waiting for the WAL flush: set_config(..., true) lasts
		// until the end of the statement's implicit transaction, so only
		// this commit is asynchronous. The claim that came before it was
		// flushed: if PostgreSQL crashes before this commit reaches disk,
		// the key is found in progress, never free (docs/strategies.md,
		// "The answer's commit").
		complete: r.Replace(strings.Replace(completeSQL, "\nWHERE ",
			"\nFROM (SELECT set_config('synchronous_commit', 'off', true)) AS async\nWHERE ", 1)),

		// $1 scope, $2 key, $3 owner, $4 retention.
		release: r.Replace(`
DELETE FROM {t}
WHERE user_id = $1 AND key = $2 AND owner_token = $3
	AND response_status IS NULL AND created_at >= now() - $4::bigint * interval '1 microsecond'`),

		// $1 scope, $2 key, $3 retention. Run only after an update or delete
		// matched no row, to tell why.
		inspect: r.Replace(`
SELECT owner_token, response_status IS NOT NULL FROM {t}
WHERE user_id = $1 AND key = $2 AND created_at >= now() - $3::bigint * interval '1 microsecond'`),

		// $1 retention, $2 limit. SKIP LOCKED lets several sweepers (and
		// a Claim taking over an expired row) run at once.
		sweepBatch: r.Replace(`
DELETE FROM {t}
WHERE (user_id, key) IN (
	SELECT user_id, key FROM {t}
	WHERE created_at < now() - $1::bigint * interval '1 microsecond'
	ORDER BY created_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED
)`),
	}
	// The same writes announcing their key when they changed a row
	// (Config.Notify): complete's $8 and release's $5 are the channel, the
	// next parameter the key's tag.
	st.completeNotify = withNotify(st.complete, 8)
	st.completeInNotify = withNotify(st.completeIn, 8)
	st.releaseNotify = withNotify(st.release, 5)
	return st
}

// completeSQL stores the answer of the in-progress row an owner claimed.
//
// $1 scope, $2 key, $3 owner, $4 status, $5 headers, $6 body, $7 retention.
//
// The answer write is a HOT update (TestAnswerWritesAreHOT): it changes no
// column an index uses (migration 0003 dropped the partial index whose
// predicate read response_status), and fillfactor leaves room for the new
// version on its page. reconcile_after = NULL takes a postponed row out of the
// reconciler's partial index once it has its answer; on every other row it is
// already NULL, which PostgreSQL counts as unchanged.
//
// Every statement says "no answer yet" as response_status IS NULL, and only
// this one sets an answer, with its completed_at: no CHECK constraint is
// needed to keep the two NULL together (migration 0004 dropped them).
// TestPlansUseThePrimaryKey pins the plans of the writes on the primary key.
const completeSQL = `
UPDATE {t} SET
	response_status  = $4,
	response_headers = $5,
	response_body    = $6,
	completed_at     = now(),
	reconcile_after  = NULL
WHERE user_id = $1 AND key = $2 AND owner_token = $3
	AND response_status IS NULL AND created_at >= now() - $7::bigint * interval '1 microsecond'`

// withNotify wraps a write of one row so that, when it changed the row, it
// also pg_notify's parameter $n (the channel) with $n+1 (the payload).
func withNotify(write string, n int) string {
	return "WITH w AS (" + write + "\nRETURNING 1\n)\nSELECT pg_notify($" + strconv.Itoa(n) + ", $" + strconv.Itoa(n+1) + ") FROM w"
}

// leaseStatements are the statements of a [Leader], over the table's lease
// table (migration 0006), each one autocommit round trip.
type leaseStatements struct {
	hold, release string
}

// newLeaseStatements builds them for the quoted, qualified lease table l.
func newLeaseStatements(l string) leaseStatements {
	r := strings.NewReplacer("{l}", l)
	return leaseStatements{
		// $1 job, $2 holder, $3 length (microseconds).
		//
		// Takes the job's lease when nobody holds it, when its lease has
		// expired, or when $2 holds it already (a renewal); it returns no
		// row when another holder's lease is live. Two holders racing for
		// one lease serialise on its row lock; the second re-checks the
		// WHERE against the first's row. The statement's now() and the
		// new expiry are returned, so that the caller counts the lease's
		// remaining time on the database's clock only.
		hold: r.Replace(`
INSERT INTO {l} AS l (job, holder, expires_at)
VALUES ($1, $2, now() + $3::bigint * interval '1 microsecond')
ON CONFLICT (job) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE l.holder = excluded.holder OR l.expires_at <= now()
RETURNING now(), l.expires_at`),

		// $1 job, $2 holder. Ends $2's lease now, if it still holds it.
		release: r.Replace(`
UPDATE {l} SET expires_at = now()
WHERE job = $1 AND holder = $2 AND expires_at > now()`),
	}
}
