DROP TABLE IF EXISTS idempotency_keys_reconcile;

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
        EXECUTE format('ALTER TABLE %s RESET (fillfactor)', part);
    END LOOP;
END $$;

DROP INDEX IF EXISTS idempotency_keys_reconcile_after_idx;

CREATE INDEX IF NOT EXISTS idempotency_keys_in_progress_idx
    ON idempotency_keys (created_at)
    WHERE response_status IS NULL;
