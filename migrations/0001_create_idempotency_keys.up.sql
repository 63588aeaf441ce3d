-- idem's table: one row per (user, Idempotency-Key), holding the fingerprint
-- of the first request, the attempt that owns the key and, once finished,
-- the stored answer; beside it the reconciler's progress and the leases of
-- the jobs that run on one instance at a time.
--
-- Every statement is idem's (package durable); the columns' rules are kept by
-- the code that writes them, not by CHECK constraints, which every claim and
-- answer write would pay for (5% to 7% of the database's work per request,
-- measured with pgbench).
CREATE TABLE idempotency_keys (
    user_id            text        NOT NULL,
    key                text        NOT NULL,
    request_hash       bytea       NOT NULL,
    owner_token        bytea       NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    hold_until         timestamptz NOT NULL,
    retention          interval    NOT NULL,
    reconcile_attempts integer     NOT NULL DEFAULT 0,
    intent_id          bytea       NULL,
    attempt            integer     NULL,
    response_status    smallint    NULL,
    response_headers   jsonb       NULL,
    response_body      bytea       NULL,
    completed_at       timestamptz NULL,
    released_at        timestamptz NULL,
    reconcile_after    timestamptz NULL,

    CONSTRAINT idempotency_keys_pkey PRIMARY KEY (user_id, key)
);

-- Expired rows are swept, and rows never looked at by the reconciler are
-- listed, by created_at.
CREATE INDEX idempotency_keys_created_at_idx
    ON idempotency_keys (created_at);

-- Rows whose reconciliation is postponed (their outcome is still unknown),
-- and only they. No index reads response_status, so that the answer write
-- changes no indexed column and is a HOT update (heap-only tuple: the new
-- version on the same page, no index entry written).
CREATE INDEX idempotency_keys_reconcile_after_idx
    ON idempotency_keys (reconcile_after)
    WHERE reconcile_after IS NOT NULL;

-- fillfactor 93 leaves room on each page for the answered version of its
-- rows, so that the answer write finds space for its HOT update
-- (TestAnswerWritesAreHOT). On a partitioned table it is set on every
-- partition: a partitioned table has no storage of its own.
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

COMMENT ON TABLE idempotency_keys IS
    'Idempotency keys of retried requests: one row per user and key.';
COMMENT ON COLUMN idempotency_keys.user_id IS
    'Scope of the key: the authenticated user.';
COMMENT ON COLUMN idempotency_keys.key IS
    'The Idempotency-Key sent by the client.';
COMMENT ON COLUMN idempotency_keys.request_hash IS
    'SHA-256 fingerprint of the request the key was first sent with (32 bytes).';
COMMENT ON COLUMN idempotency_keys.owner_token IS
    'Random token of the current attempt (16 bytes); only it may store the answer or release the row.';
COMMENT ON COLUMN idempotency_keys.created_at IS
    'Database time of the current attempt''s claim.';
COMMENT ON COLUMN idempotency_keys.hold_until IS
    'created_at plus how long the current attempt''s execution may hold the key (its Guard''s MaxHold); the reconciler leaves the row alone that long.';
COMMENT ON COLUMN idempotency_keys.retention IS
    'How long the row lives after its answer or release: the longest retention of the instances that claimed, answered or released it. A row in progress never expires.';
COMMENT ON COLUMN idempotency_keys.reconcile_attempts IS
    'Reconciliation attempts that could not learn the outcome of this in-progress attempt.';
COMMENT ON COLUMN idempotency_keys.intent_id IS
    'Intent of the key, kept across releases (16 bytes); NULL while it is the first attempt''s owner_token.';
COMMENT ON COLUMN idempotency_keys.attempt IS
    'Which claim of the intent the row is on: NULL for the first, plus one per release taken over.';
COMMENT ON COLUMN idempotency_keys.response_status IS
    'HTTP status of the stored answer (100 to 599); NULL while the request is in progress.';
COMMENT ON COLUMN idempotency_keys.response_headers IS
    'Headers of the stored answer as a JSON object of string arrays.';
COMMENT ON COLUMN idempotency_keys.response_body IS
    'Body of the stored answer.';
COMMENT ON COLUMN idempotency_keys.completed_at IS
    'Database time the answer was stored; NULL while in progress.';
COMMENT ON COLUMN idempotency_keys.released_at IS
    'Database time the current attempt was released (nothing happened); the next claim of the same request takes the row over.';
COMMENT ON COLUMN idempotency_keys.reconcile_after IS
    'Database time before which the reconciler does not try this in-progress row again; NULL: not postponed.';

-- The reconciler's progress through new rows: every in-progress row created
-- at or before scanned_to has been looked at once. One row, written only by
-- the instance that holds the reconcile lease.
CREATE TABLE idempotency_keys_reconcile (
    singleton  boolean     PRIMARY KEY DEFAULT true,
    scanned_to timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT idempotency_keys_reconcile_one CHECK (singleton)
);

COMMENT ON TABLE idempotency_keys_reconcile IS
    'How far the reconciler has scanned idempotency_keys for in-progress rows, by created_at.';

-- Who leads each job that runs on one instance at a time across a fleet (the
-- reconciler, the sweeper), and until when by the database's clock. A lease
-- is taken, renewed and given back by one autocommit statement each, so it
-- works through any connection pooler, PgBouncer in transaction mode too.
CREATE TABLE idempotency_keys_leases (
    job        text        PRIMARY KEY,
    holder     text        NOT NULL,
    expires_at timestamptz NOT NULL
);

COMMENT ON TABLE idempotency_keys_leases IS
    'Who leads each periodic job (reconcile, sweep) on idempotency_keys, and until when (database time).';

-- The version of the schema, which every build of idem checks before it
-- serves (durable's Store, its sweeper and reconciler): a build refuses a
-- table whose version is not the one its statements are written for, so an
-- instance of an older build never acts under rules a newer migration
-- changed. Each later migration replaces the view with its own number.
CREATE OR REPLACE VIEW idempotency_keys_schema AS SELECT 1 AS version;

COMMENT ON VIEW idempotency_keys_schema IS
    'Version of the idempotency_keys schema: the number of the last migration applied.';
