-- Rows released since 0005 go back to being absent, as a release deleted
-- them before.
DELETE FROM idempotency_keys WHERE released_at IS NOT NULL;

ALTER TABLE idempotency_keys
    DROP COLUMN IF EXISTS released_at,
    DROP COLUMN IF EXISTS hold_until,
    DROP COLUMN IF EXISTS attempt,
    DROP COLUMN IF EXISTS intent_id;

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
        EXECUTE format('ALTER TABLE %s SET (fillfactor = 95)', part);
    END LOOP;
END $$;

COMMENT ON COLUMN idempotency_keys.owner_token IS
    'Random token of the worker that claimed the key; only it may complete or release the row.';
COMMENT ON COLUMN idempotency_keys.created_at IS
    'Database time of the claim; the key expires retention after it.';
