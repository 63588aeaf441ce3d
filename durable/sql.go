package durable

import (
	"strconv"
	"strings"
)

// columns is the select list every statement that returns rows uses, in the
// order scanRecord reads them. A first attempt stores no intent_id (its
// intent is its owner_token) and no attempt number (1), which keeps the row
// narrow. now() is the database's clock at the statement, from which the
// Store tells how long the row still lives (idem.Record.TTL) without
// comparing it with any host's clock.
const columns = `user_id, key, request_hash, owner_token, response_status,
	response_headers, response_body, created_at, completed_at,
	coalesce(intent_id, owner_token) AS intent_id, coalesce(attempt, 1) AS attempt,
	hold_until, released_at, retention, now()`

// statements holds every SQL statement of a Store, built once by New for its
// table. Each is one round trip.
type statements struct {
	claim, insert, takeover, get, release string
	releaseNotify                         string
	giveBack, giveBackNotify              string
	inspect, sweepBatch                   string
	// complete is the answer write; completeNotify announces it too.
	complete, completeNotify string
	// completeAsync and completeAsyncNotify are the same writes committed
	// without waiting for their flush (Config.AsynchronousAnswers).
	completeAsync, completeAsyncNotify string
	// The group commit's statements (batch.go): claimMany is claim over
	// arrays of requests; the completeMany writes are the answer writes
	// over arrays.
	claimMany, insertMany                      string
	completeMany, completeManyNotify           string
	completeManyAsync, completeManyAsyncNotify string
	// complete and release under a lease ([Store.Lead]) (see fenced): the
	// reconciler's settle and release.
	completeFenced, completeFencedNotify string
	releaseFenced, releaseFencedNotify   string
}

// Every row keeps its own retention: how long it lives after its answer
// (completed_at) or its release (released_at). The claim writes the
// retention of the Store that claims; the answer write, the release and the
// give-back raise it to their own Store's when that is longer. So a key
// lives at least as long as every instance that took part in it promised,
// whatever the retention of the instance that reads, sweeps or claims it
// later: no Store's setting decides for another's rows.
//
// A row in progress never expires, however old, so that an unanswered key
// can never be claimed again as a new intent while its first execution's
// outcome is unknown.
const (
	// live is the condition under which a row is live: in progress, or
	// answered less than its retention ago. A released row is not live: no
	// claim holds it, and the next Claim takes it over (see takeable).
	live = "released_at IS NULL AND (completed_at IS NULL OR completed_at + retention >= now())"
	// expired is the condition under which a row has expired: answered or
	// released longer than its retention ago.
	expired = "coalesce(completed_at, released_at) + retention < now()"
)

// retentionParam is the retention of the Store that writes, as parameter
// $n in microseconds, turned into an interval by the database.
func retentionParam(n int) string {
	return "$" + strconv.Itoa(n) + "::bigint * interval '1 microsecond'"
}

// newStatements builds the statements for the quoted, qualified table name t.
func newStatements(t string) *statements {
	r := strings.NewReplacer(
		"{t}", t,
		"{cols}", columns,
		"{expired}", expired,
		"{live}", live,
		"{retention5}", retentionParam(5),
		"{retention7}", retentionParam(7),
	)
	// takeable: the existing row of the key is the claim's to take over,
	// with h the fingerprint: it has expired (a new intent), or it was
	// released and the request is the same (a new attempt of the same
	// intent). A released row of another request is not: that request is
	// refused as a reused key.
	takeable := func(h string) string {
		return "coalesce(" + expired + " OR (released_at IS NOT NULL AND response_status IS NULL AND request_hash = " + h + "), false)"
	}
	r2 := strings.NewReplacer("{takeable}", takeable("$3"), "{takeableMany}", takeable("req.h"))
	st := &statements{
		// $1 scope, $2 key, $3 fingerprint, $4 owner, $5 retention,
		// $6 intent, $7 hold (microseconds).
		//
		// cur reads the key's row, if any, with a plain read: it waits on no
		// row lock, so a row locked by a running transaction (a caller's
		// transaction that completed its answer and has not committed yet)
		// is seen as it was, in progress, and the claim answers at once.
		// An intent equal to the owner token (the first attempt's, see
		// ClaimParams.Intent) is stored as NULL, and so is the first
		// attempt's number, which keeps the row narrow and the answer write
		// HOT (TestAnswerWritesAreHOT).
		//
		// ins inserts the row only when cur found none, so a claim of a
		// taken key never reaches ON CONFLICT's pre-check, which would wait
		// for that transaction. A new key costs a primary-key probe, the
		// pre-check and the insert; a taken key (a replay, a retry in
		// progress, a reused key) a primary-key read, with no lock, no
		// transaction id, no WAL and no commit flush. An expired row, or a
		// released one retried with the same request, is taken over by
		// the takeover statement, a second round trip.
		//
		// Under READ COMMITTED both read the statement's snapshot, so a row
		// another claimer committed after it started is not seen: the
		// INSERT then conflicts, the statement returns no row and Claim
		// falls back to Get. (Such a conflict waits for the other
		// claimer's INSERT to commit, which is the other claim's own
		// round trip.)
		claim: r2.Replace(r.Replace(`
WITH cur AS (
	SELECT {cols}, {takeable} AS takeable FROM {t}
	WHERE user_id = $1 AND key = $2
), ins AS (
	INSERT INTO {t} (user_id, key, request_hash, owner_token, intent_id, hold_until, retention)
	SELECT $1, $2, $3, $4, nullif($6::bytea, $4::bytea), now() + $7::bigint * interval '1 microsecond', {retention5}
	WHERE NOT EXISTS (SELECT 1 FROM cur)
	ON CONFLICT (user_id, key) DO NOTHING
	RETURNING {cols}
)
SELECT {cols}, true AS claimed, false AS takeable FROM ins
UNION ALL
SELECT {cols}, false, takeable FROM cur`)),

		// $1 to $7 as claim's.
		//
		// The claim of a key believed new (Store.Claim inserts first while
		// its claims rarely find a row): the insert alone, returning only
		// what the Store does not know already. Its NOT EXISTS reads the
		// key's committed row, if any, without waiting for a row lock, and
		// then inserts nothing, so that, as with claim, only a claim of the
		// key in flight makes ON CONFLICT's pre-check wait. It returns no
		// row when the key has one; Claim then runs claim. For a new key it
		// costs PostgreSQL about a fifth less CPU than claim (pgbench,
		// docs/capacity.md): no CTEs, no union, two columns returned.
		insert: r.Replace(`
INSERT INTO {t} (user_id, key, request_hash, owner_token, intent_id, hold_until, retention)
SELECT $1, $2, $3, $4, nullif($6::bytea, $4::bytea), now() + $7::bigint * interval '1 microsecond', {retention5}
WHERE NOT EXISTS (SELECT FROM {t} WHERE user_id = $1 AND key = $2)
ON CONFLICT (user_id, key) DO NOTHING
RETURNING created_at, hold_until`),

		// insert over arrays of requests, with claimMany's parameters: it
		// returns the scope, key, created_at and hold_until of each row it
		// inserted. Its inserts go in key order, as claimMany's. OFFSET 0
		// keeps its NOT EXISTS a probe of the primary key per request:
		// pulled up into an anti-join, it was planned on a new table as a
		// hash join over a sequential scan, a plan that prepared statements
		// kept while the table grew (TestPlansOnANewTable).
		insertMany: r.Replace(`
INSERT INTO {t} (user_id, key, request_hash, owner_token, intent_id, hold_until, retention)
SELECT req.s, req.k, req.h, req.o, nullif(req.i, req.o), now() + req.hold * interval '1 microsecond', {retention5}
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bytea[], $6::bytea[], $7::bigint[]) AS req(s, k, h, o, i, hold)
WHERE NOT EXISTS (SELECT FROM {t} WHERE user_id = req.s AND key = req.k OFFSET 0)
ORDER BY req.s, req.k
ON CONFLICT (user_id, key) DO NOTHING
RETURNING user_id, key, created_at, hold_until`),

		// claim over arrays of requests, one per key: $1 scopes, $2 keys,
		// $3 fingerprints, $4 owners, $6 intents, $7 holds, and $5 the
		// retention. It returns a row for each request whose key had a row
		// (claimed false) or got one (claimed true), and none for a request
		// whose key another claimer committed after the statement began, as
		// claim does. Its inserts go in the order of the keys, so two of
		// them that share keys wait for each other in one order and never
		// deadlock.
		claimMany: r2.Replace(r.Replace(`
WITH req AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bytea[], $6::bytea[], $7::bigint[])
		AS req(s, k, h, o, i, hold)
), cur AS (
	SELECT {cols}, {takeableMany} AS takeable FROM req JOIN {t} ON user_id = req.s AND key = req.k
), ins AS (
	INSERT INTO {t} (user_id, key, request_hash, owner_token, intent_id, hold_until, retention)
	SELECT req.s, req.k, req.h, req.o, nullif(req.i, req.o), now() + req.hold * interval '1 microsecond', {retention5}
	FROM req WHERE NOT EXISTS (SELECT 1 FROM cur WHERE cur.user_id = req.s AND cur.key = req.k)
	ORDER BY req.s, req.k
	ON CONFLICT (user_id, key) DO NOTHING
	RETURNING {cols}
)
SELECT {cols}, true AS claimed, false AS takeable FROM ins
UNION ALL
SELECT {cols}, false, takeable FROM cur`)),

		// $1 scope, $2 key, $3 fingerprint, $4 owner, $5 retention,
		// $6 intent, $7 hold (microseconds).
		//
		// Takes over the row of a key that is takeable: an expired row
		// becomes a new intent ($6, attempt 1, the new fingerprint, this
		// Store's retention), as if it had been deleted and inserted again;
		// a released row becomes the next attempt of its intent (same
		// intent, attempt + 1, the longer of the two retentions). Either
		// way the row gets the new owner, no answer, a fresh created_at
		// and hold_until, and no reconciliation state. Two takeovers of
		// one row serialise on its row lock; the second re-checks the WHERE
		// against the new version, finds it claimed, and updates nothing.
		//
		// Expiry is stated on completed_at and released_at, which no index
		// serves: a planner can only reach the row through the primary
		// key (TestPlansUseThePrimaryKey).
		takeover: r2.Replace(r.Replace(`
UPDATE {t} SET
	request_hash       = $3,
	owner_token        = $4,
	intent_id          = CASE WHEN {expired} THEN nullif($6::bytea, $4::bytea) ELSE coalesce(intent_id, owner_token) END,
	attempt            = CASE WHEN {expired} THEN NULL ELSE coalesce(attempt, 1) + 1 END,
	retention          = CASE WHEN {expired} THEN {retention5} ELSE greatest(retention, {retention5}) END,
	response_status    = NULL,
	response_headers   = NULL,
	response_body      = NULL,
	created_at         = now(),
	completed_at       = NULL,
	released_at        = NULL,
	hold_until         = now() + $7::bigint * interval '1 microsecond',
	reconcile_attempts = 0,
	reconcile_after    = NULL
WHERE user_id = $1 AND key = $2 AND {takeable}
RETURNING {cols}`)),

		// $1 scope, $2 key.
		get: r.Replace(`
SELECT {cols} FROM {t}
WHERE user_id = $1 AND key = $2 AND {live}`),

		// The answer write: see completeSQL. It commits with the
		// transaction's synchronous_commit (on, unless the server or the
		// caller's transaction says otherwise): once it returns, the answer
		// is on disk.
		complete: r.Replace(completeSQL),

		// The same write committed without waiting for its flush
		// (Config.AsynchronousAnswers): set_config(..., true) lasts until
		// the end of the statement's implicit transaction, so only this
		// commit is asynchronous.
		completeAsync: r.Replace(strings.Replace(completeSQL, "\nWHERE ", "\nFROM "+asyncCommit+"\nWHERE ", 1)),

		// The answer write over arrays of answers, one per key: $1
		// scopes, $2 keys, $3 owners, $4 statuses, $5 headers (JSON), $6
		// bodies, and $7 the writer's retention. It returns the scope and key of
		// each row it wrote; a request it returns nothing for is told why
		// alone, as after complete. Answers of the same keys come from one
		// owner each, so two of these statements never wait for each
		// other's rows.
		completeMany:            r.Replace(completeManySQL("", false)),
		completeManyAsync:       r.Replace(completeManySQL(asyncCommit+", ", false)),
		completeManyNotify:      r.Replace(completeManySQL("", true)),
		completeManyAsyncNotify: r.Replace(completeManySQL(asyncCommit+", ", true)),

		// $1 scope, $2 key, $3 owner, $4 the writer's retention.
		//
		// Marks the owner's in-progress row released: it keeps its
		// fingerprint and intent, so the same key with another request is
		// still refused, and the next claim of the same request takes it
		// over as a new attempt of the same intent. reconcile_after = NULL
		// takes a postponed row out of the reconciler's partial index.
		release: r.Replace(`
UPDATE {t} SET released_at = now(), reconcile_after = NULL,
	retention = greatest(retention, ` + retentionParam(4) + `)
WHERE user_id = $1 AND key = $2 AND owner_token = $3
	AND response_status IS NULL AND released_at IS NULL`),

		// $1 scope, $2 key, $3 fingerprint, $4 owner, $5 the writer's
		// retention.
		//
		// Gives back a claim whose reply was lost (the Guard's give-back):
		// the owner's in-progress row is marked released, as release does.
		// Unlike release it waits for a claim of the key still in flight:
		// its INSERT meets the uncommitted row of that claim and waits for
		// its transaction to end, then updates the row if the claim
		// committed it, under the owner check. When no row holds the key,
		// it writes one already released, under the request's fingerprint
		// (a released first attempt), so that a claim that never arrived
		// cannot take the key afterwards: its statement finds a row and
		// inserts nothing. Another owner's row, or an answered or released
		// one, is left as it is.
		giveBack: r.Replace(`
INSERT INTO {t} AS r (user_id, key, request_hash, owner_token, hold_until, retention, released_at)
VALUES ($1, $2, $3, $4, now(), {retention5}, now())
ON CONFLICT (user_id, key) DO UPDATE SET released_at = now(), reconcile_after = NULL,
	retention = greatest(r.retention, excluded.retention)
WHERE r.owner_token = excluded.owner_token AND r.response_status IS NULL AND r.released_at IS NULL`),

		// $1 scope, $2 key. Run only after an update matched no row, to
		// tell why.
		inspect: r.Replace(`
SELECT owner_token, response_status IS NOT NULL FROM {t}
WHERE user_id = $1 AND key = $2 AND {live}`),

		// $1 the sweeping Store's retention, $2 limit, $3 where the last
		// batch ended (the newest created_at it deleted; -infinity for the
		// first). SKIP LOCKED lets several sweepers (and a Claim taking
		// over an expired row) run at once.
		//
		// Each row expires by its own retention. A row's created_at comes
		// before its answer or release, so a row of this Store's retention
		// or a shorter one that has expired was created more than this
		// Store's retention ago: the created_at index bounds the range, and
		// each batch goes on from where the last one ended, so one run
		// reads the range once. The rows in it that have not expired (in
		// progress, or kept longer by another instance's retention) are
		// passed over; a row of a shorter retention is deleted later than
		// it expired, which changes nothing (an expired row is invisible to
		// every statement). It returns the created_at of each row it
		// deleted.
		sweepBatch: r.Replace(`
DELETE FROM {t}
WHERE (user_id, key) IN (
	SELECT user_id, key FROM {t}
	WHERE created_at >= $3 AND created_at < now() - $1::bigint * interval '1 microsecond'
		AND {expired}
	ORDER BY created_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED
)
RETURNING created_at`),
	}
	// The same writes announcing their key when they changed a row
	// (Config.Notify): complete's $8, release's $5 and giveBack's $6 are
	// the channel, the next parameter the key's tag.
	st.completeNotify = withNotify(st.complete, 8)
	st.completeAsyncNotify = withNotify(st.completeAsync, 8)
	st.releaseNotify = withNotify(st.release, 5)
	st.giveBackNotify = withNotify(st.giveBack, 6)
	// The same writes under a lease ([Store.Lead]): complete's $8 and $9 and
	// release's $5 and $6 are the lease's job and holder, the next two
	// parameters the channel and the tag. A fenced answer write always
	// waits for its flush: only the reconciler makes one, rarely.
	l := besideTable(t, "_leases")
	st.completeFenced = fenced(l, 8, r.Replace(completeSQL)+fenceCond, 0)
	st.completeFencedNotify = fenced(l, 8, r.Replace(completeSQL)+fenceCond, 10)
	st.releaseFenced = fenced(l, 5, st.release+fenceCond, 0)
	st.releaseFencedNotify = fenced(l, 5, st.release+fenceCond, 7)
	return st
}

// fenceCond ends the WHERE clause of a write to be fenced (see fenced).
const fenceCond = "\n\tAND {fenced}"

// fenced makes write a write under a lease ([Store.Lead]), for a holder that may
// have been paused past it (a SIGSTOP, a VM pause) and cannot know: the
// lease of job $j held by $j+1, in the lease table l. write changes at most
// one row, and holds {fenced} in its condition. The statement changes that
// row only while the lease is $j+1's and live on the database's clock (its
// expires_at after the statement's now(); no host's clock is read), and
// returns whether it was, and how many rows it changed. With notify > 0 it
// also pg_notify's $notify (the channel) with $notify+1 (the payload) when it
// changed the row.
//
// It locks the lease row FOR SHARE before it reads the table (the one-time
// filter on the fence): a next holder's take, an update of that row, waits
// for the write to commit, and a write that meets a take re-reads the row
// and finds another holder. So a fenced write commits before the lease can
// change hands, or changes nothing: whatever the next holder reads, it reads
// after the write. The leader's own renewal waits for it too, a moment.
func fenced(l string, j int, write string, notify int) string {
	n := func(i int) string { return "$" + strconv.Itoa(i) }
	write = strings.Replace(write, "{fenced}", "EXISTS (SELECT FROM fence)", 1)
	changed := "count(*) FROM w"
	if notify > 0 {
		changed += " CROSS JOIN LATERAL pg_notify(" + n(notify) + ", " + n(notify+1) + ") AS n"
	}
	return `WITH fence AS (
	SELECT FROM ` + l + ` WHERE job = ` + n(j) + ` AND holder = ` + n(j+1) + ` AND expires_at > now() FOR SHARE
), w AS (` + write + `
RETURNING 1
)
SELECT EXISTS (SELECT FROM fence), ` + changed
}

// asyncCommit, in a statement's FROM, makes its implicit transaction commit
// without waiting for the WAL flush.
const asyncCommit = "(SELECT set_config('synchronous_commit', 'off', true)) AS async"

// completeManySQL is completeSQL over arrays (see completeMany), with from
// before the arrays in its FROM list. With notify, the answers also carry
// their keys' tags ($9), and the statement pg_notify's $8 (the channel) with
// the tag of each row it wrote.
func completeManySQL(from string, notify bool) string {
	arrays, names := "", ""
	if notify {
		arrays, names = ", $9::text[]", ", tag"
	}
	write := `
UPDATE {t} SET
	response_status  = ans.status,
	response_headers = ans.headers::jsonb,
	response_body    = ans.body,
	completed_at     = now(),
	reconcile_after  = NULL,
	retention        = greatest(retention, {retention7})
FROM ` + from + `unnest($1::text[], $2::text[], $3::bytea[], $4::int2[], $5::text[], $6::bytea[]` + arrays + `)
	AS ans(s, k, o, status, headers, body` + names + `)
WHERE user_id = ans.s AND key = ans.k AND owner_token = ans.o
	AND response_status IS NULL AND {live}
RETURNING ans.s, ans.k`
	if !notify {
		return write
	}
	return "WITH w AS (" + write + ", ans.tag\n)\nSELECT w.s, w.k FROM w CROSS JOIN LATERAL pg_notify($8, w.tag) AS n"
}

// completeSQL stores the answer of the in-progress row an owner claimed.
//
// $1 scope, $2 key, $3 owner, $4 status, $5 headers, $6 body, $7 the
// writer's retention, which the row keeps when it is longer than its own.
//
// The answer write is a HOT update (TestAnswerWritesAreHOT): it changes no
// column an index uses (no index reads response_status or retention), and
// fillfactor leaves room for the new version on its page. reconcile_after = NULL takes a postponed
// row out of the reconciler's partial index once it has its answer; on
// every other row it is already NULL, which PostgreSQL counts as unchanged.
//
// A row in progress never expires, so only a released one is refused by the
// liveness check ({live}).
//
// Every statement says "no answer yet" as response_status IS NULL, and only
// this one sets an answer, with its completed_at: no CHECK constraint is
// needed to keep the two NULL together.
// TestPlansUseThePrimaryKey pins the plans of the writes on the primary key.
const completeSQL = `
UPDATE {t} SET
	response_status  = $4,
	response_headers = $5,
	response_body    = $6,
	completed_at     = now(),
	reconcile_after  = NULL,
	retention        = greatest(retention, {retention7})
WHERE user_id = $1 AND key = $2 AND owner_token = $3
	AND response_status IS NULL AND {live}`

// withNotify wraps a write of one row so that, when it changed the row, it
// also pg_notify's parameter $n (the channel) with $n+1 (the payload).
func withNotify(write string, n int) string {
	return "WITH w AS (" + write + "\nRETURNING 1\n)\nSELECT pg_notify($" + strconv.Itoa(n) + ", $" + strconv.Itoa(n+1) + ") FROM w"
}

// leaseStatements are the statements of a lease ([Store.Lead]), over the lease table
// beside the table (<table>_leases), each one autocommit round trip.
type leaseStatements struct {
	take, renew, release string
}

// newLeaseStatements builds them for the quoted, qualified lease table l.
func newLeaseStatements(l string) leaseStatements {
	r := strings.NewReplacer("{l}", l)
	return leaseStatements{
		// $1 job, $2 holder, $3 length (microseconds).
		//
		// Takes the job's lease when nobody holds it or its lease has
		// expired; it returns no row when another holder's lease is live.
		// Two holders racing for one lease serialise on its row lock; the
		// second re-checks the WHERE against the first's row. The
		// statement's now() and the new expiry are returned, so that the
		// caller counts the lease's remaining time on the database's clock
		// only.
		take: r.Replace(`
INSERT INTO {l} AS l (job, holder, expires_at)
VALUES ($1, $2, now() + $3::bigint * interval '1 microsecond')
ON CONFLICT (job) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE l.expires_at <= now()
RETURNING now(), l.expires_at`),

		// $1 job, $2 holder, $3 length (microseconds).
		//
		// Renews $2's lease while it is live, and returns as take does; no
		// row once it has expired, even if nobody took it since: a lease
		// that passed is never $2's again, so a write fenced by it (see
		// fenced) cannot land in a later term, after another holder's.
		renew: r.Replace(`
UPDATE {l} SET expires_at = now() + $3::bigint * interval '1 microsecond'
WHERE job = $1 AND holder = $2 AND expires_at > now()
RETURNING now(), expires_at`),

		// $1 job, $2 holder. Ends $2's lease now, if it still holds it.
		release: r.Replace(`
UPDATE {l} SET expires_at = now()
WHERE job = $1 AND holder = $2 AND expires_at > now()`),
	}
}

// backlogStatements are the reconciler's statements (see backlog.go) over
// the table and its <table>_reconcile row, each one autocommit round trip.
//
// No index lists in-progress rows: one whose predicate reads response_status
// would make every answer write a non-HOT update. A run finds due rows in
// two places instead:
//
//   - postponed rows, whose reconcile_after is set, through the partial index
//     on reconcile_after, which holds only them;
//   - rows never looked at, created between the last run's high-water mark
//     (minus an overlap) and now - MinAge, through the created_at index: a
//     range of the rows created since the last run, not the whole day.
//
// The listings say which rows may be due by the database's clock; whether
// the execution that holds one has ended, the reconciler judges on its own
// monotonic clock from the row's hold (hold_until - created_at, a duration:
// both are the claim's now()), never by comparing hold_until with now(),
// which a step of the database's clock would move. Released rows are not in
// progress: no claim holds them.
type backlogStatements struct {
	listPostponed, listNew, window, mark, postpone string
	// mark and postpone under a lease ([Store.Lead]) (see fenced): the
	// reconciler's.
	markFenced, postponeFenced string
}

// dueColumns is the select list of both listings, in the order collectDue
// reads them.
const dueColumns = `user_id, key, request_hash, owner_token, coalesce(intent_id, owner_token), coalesce(attempt, 1),
	created_at, reconcile_attempts, hold_until`

// newBacklogStatements builds them for the quoted, qualified table t and its
// reconciler's table state.
func newBacklogStatements(t, state string) backlogStatements {
	r := strings.NewReplacer("{t}", t, "{state}", state, "{due}", dueColumns)
	st := backlogStatements{
		// $1 limit. The rows whose backoff ended, in the order it ended. A row in progress never expires,
		// so no retention bounds the list.
		listPostponed: r.Replace(`
SELECT {due} FROM {t}
WHERE reconcile_after IS NOT NULL AND reconcile_after <= now()
	AND response_status IS NULL AND released_at IS NULL
ORDER BY reconcile_after, user_id, key
LIMIT $1`),

		// $1, $2, $3 the position (created_at, user_id, key) to list after;
		// $4 the end of the window; $5 limit. Oldest first.
		listNew: r.Replace(`
SELECT {due} FROM {t}
WHERE created_at >= $1 AND created_at <= $4
	AND (created_at, user_id, key) > ($1, $2, $3)
	AND response_status IS NULL AND released_at IS NULL AND reconcile_after IS NULL
ORDER BY created_at, user_id, key
LIMIT $5`),

		// $1 min age, $2 overlap (microseconds). The window of a scan of new
		// rows: from the mark of the last scan less the overlap (or the
		// oldest row, for the very first scan: a row in progress never
		// expires, so no retention bounds what is left to look at), to now
		// - min age. The oldest row is the first entry of the created_at
		// index; an empty table gives an empty window.
		window: r.Replace(`
SELECT coalesce(
		(SELECT scanned_to FROM {state}) - $2::bigint * interval '1 microsecond',
		(SELECT min(created_at) FROM {t}),
		now() - $1::bigint * interval '1 microsecond'),
	now() - $1::bigint * interval '1 microsecond'`),

		// $1 the new mark.
		mark: r.Replace(`
INSERT INTO {state} AS s (singleton, scanned_to) VALUES (true, $1)
ON CONFLICT (singleton) DO UPDATE SET scanned_to = excluded.scanned_to, updated_at = now()`),

		// $1 the new mark, $2 and $3 the lease's job and holder.
		markFenced: fenced(besideTable(t, "_leases"), 2, r.Replace(`
INSERT INTO {state} AS s (singleton, scanned_to) SELECT true, $1::timestamptz WHERE {fenced}
ON CONFLICT (singleton) DO UPDATE SET scanned_to = excluded.scanned_to, updated_at = now()`), 0),

		// $1 scope, $2 key, $3 owner, $4 attempts, $5 delay (microseconds).
		// The owner check keeps the backoff on the attempt that was listed.
		postpone: r.Replace(`
UPDATE {t} SET
	reconcile_attempts = $4,
	reconcile_after    = now() + $5::bigint * interval '1 microsecond'
WHERE user_id = $1 AND key = $2 AND owner_token = $3
	AND response_status IS NULL AND released_at IS NULL`),
	}
	// $6 and $7 the lease's job and holder.
	st.postponeFenced = fenced(besideTable(t, "_leases"), 6, st.postpone+fenceCond, 0)
	return st
}
