-- The lifecycle of a key: an unanswered key never expires, the row carries
-- its owner's deadline, and a release keeps the intent.
--
-- intent_id   the intent the row belongs to (idem.IntentID): drawn by the
--             first claim of a key and kept by every later attempt, so that
--             names derived from it (idem.DeriveID, idem.DownstreamKey) stay
--             the same across releases. owner_token is now the token of the
--             current attempt only, which the owner checks compare. NULL on
--             rows claimed before this migration, whose intent is their
--             owner_token (every statement reads coalesce(intent_id,
--             owner_token)).
-- attempt     which claim of the intent the row is on: NULL for the first,
--             2, 3, ... after every release taken over by a retry.
-- hold_until  database time at which the current attempt's execution has
--             ended for sure: the claim's now() plus the MaxHold of the Guard
--             that claimed it. The reconciler acts on no row before it. NULL
--             on rows claimed before this migration.
-- released_at database time of the release of the current attempt ("nothing
--             happened"): the row keeps its fingerprint and intent, and the
--             next claim of the key takes it over as a new attempt. NULL
--             while claimed or answered.
--
-- A key now expires retention after its answer (completed_at) or its release
-- (released_at); a row in progress never expires, however old.
--
-- Columns without a default are catalog-only changes: no table rewrite,
-- quick on a large table. None is indexed, so the answer write stays a HOT
-- update; a first attempt stores neither intent_id nor attempt (NULL), so its
-- row grows by hold_until alone and its answered version still fits on its
-- page (TestAnswerWritesAreHOT).
ALTER TABLE idempotency_keys
    ADD COLUMN intent_id   bytea       NULL,
    ADD COLUMN attempt     integer     NULL,
    ADD COLUMN hold_until  timestamptz NULL,
    ADD COLUMN released_at timestamptz NULL;

-- hold_until makes every row 8 bytes wider, and the answered version of a
-- row must still fit beside it on its page for the answer write to stay HOT:
-- fillfactor 93 instead of 0003's 95 leaves that room (at 95,
-- TestAnswerWritesAreHOT saw 1,997 to 1,999 HOT writes of 2,000). As in 0003,
-- it applies to pages written from now on, and on a partitioned table to
-- every partition.
DO $$
DECLARE
    part regclass;
BEGIN
    FOR part IN
        SELECT c.oid::regclass FROM pg_class c
        WHERE c.oid = 'idempotency_keys'::regclass AND c.relkind = 'r'
        UNION ALL
        SELECT i.inhrelid::regclass FROM pg_inherits i
        WHERE i.inhparent = 'idempotency_keys'::regclass
    LOOP
        EXECUTE format('ALTER TABLE %s SET (fillfactor = 93)', part);
    END LOOP;
END $$;

COMMENT ON COLUMN idempotency_keys.intent_id IS
    'Intent of the key (idem.IntentID), kept across releases; NULL on rows claimed before migration 0005, whose intent is owner_token.';
COMMENT ON COLUMN idempotency_keys.owner_token IS
    'Random token of the current attempt; only it may complete or release the row.';
COMMENT ON COLUMN idempotency_keys.attempt IS
    'Which claim of the intent the row is on: NULL for the first, plus one per release taken over.';
COMMENT ON COLUMN idempotency_keys.hold_until IS
    'Database time by which the current attempt''s execution has ended (claim time + the claiming Guard''s MaxHold); the reconciler waits for it.';
COMMENT ON COLUMN idempotency_keys.released_at IS
    'Database time the current attempt was released (nothing happened); the next claim takes the row over. NULL otherwise.';
COMMENT ON COLUMN idempotency_keys.created_at IS
    'Database time of the current attempt''s claim.';
