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
-- attempt     which claim of the intent the row is on: 1, then one more
--             after every release taken over by a retry.
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
-- Columns without a default, and one with a constant default, are
-- catalog-only changes: no table rewrite, quick on a large table. None is
-- indexed, so the answer write stays a HOT update.
ALTER TABLE idempotency_keys
    ADD COLUMN intent_id   bytea       NULL,
    ADD COLUMN attempt     integer     NOT NULL DEFAULT 1,
    ADD COLUMN hold_until  timestamptz NULL,
    ADD COLUMN released_at timestamptz NULL;

COMMENT ON COLUMN idempotency_keys.intent_id IS
    'Intent of the key (idem.IntentID), kept across releases; NULL on rows claimed before migration 0005, whose intent is owner_token.';
COMMENT ON COLUMN idempotency_keys.owner_token IS
    'Random token of the current attempt; only it may complete or release the row.';
COMMENT ON COLUMN idempotency_keys.attempt IS
    'Which claim of the intent the row is on: 1, plus one per release taken over.';
COMMENT ON COLUMN idempotency_keys.hold_until IS
    'Database time by which the current attempt''s execution has ended (claim time + the claiming Guard''s MaxHold); the reconciler waits for it.';
COMMENT ON COLUMN idempotency_keys.released_at IS
    'Database time the current attempt was released (nothing happened); the next claim takes the row over. NULL otherwise.';
COMMENT ON COLUMN idempotency_keys.created_at IS
    'Database time of the current attempt''s claim.';
