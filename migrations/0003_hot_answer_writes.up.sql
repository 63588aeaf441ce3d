-- Make the answer write a HOT update, and let the reconciler find its rows
-- without an index on in-progress rows.
--
-- 1. The partial index of in-progress rows (predicate response_status IS
--    NULL) is dropped: the answer write changes response_status, and
--    PostgreSQL cannot update a row in place (HOT, heap-only tuple) when a
--    column any index uses, predicate included, changes. With the index, every
--    answer write inserted new entries into all three indexes; without it,
--    the write touches only its heap page. The reconciler now lists new
--    in-progress rows through idempotency_keys_created_at_idx, scanning only
--    the rows created since its last run (idempotency_keys_reconcile).
--
-- 2. Postponed rows (reconcile_after set: the outcome is still unknown) are
--    listed through a partial index that holds only them. The answer write
--    leaves reconcile_after NULL, unchanged, so it stays HOT.
--
-- 3. fillfactor 95 leaves room in each heap page for the answered version of
--    its rows, so that the HOT update finds space on the same page: with 8
--    writers, 95% of answer writes were HOT at 100, 99.9% at 95, and 100% at
--    80, whose heap was 60% larger (bench: BenchmarkFillfactor). It applies
--    to pages written from now on; on a partitioned table it is set on every
--    partition (a partitioned table has no storage of its own).
--
-- The CREATE INDEX below scans the table under a lock that blocks writes.
-- On a large table, create the index beforehand with CREATE INDEX
-- CONCURRENTLY under the same name and definition: IF NOT EXISTS then skips
-- it.
DROP INDEX IF EXISTS idempotency_keys_in_progress_idx;

CREATE INDEX IF NOT EXISTS idempotency_keys_reconcile_after_idx
    ON idempotency_keys (reconcile_after)
    WHERE reconcile_after IS NOT NULL;

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

-- The reconciler's progress through new rows: every in-progress row created
-- at or before scanned_to has been looked at once (and is now answered,
-- released, or postponed). One row; written only by the instance holding the
-- reconcile lock.
CREATE TABLE idempotency_keys_reconcile (
    singleton  boolean     PRIMARY KEY DEFAULT true,
    scanned_to timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT idempotency_keys_reconcile_one CHECK (singleton)
);

COMMENT ON TABLE idempotency_keys_reconcile IS
    'How far the reconciler has scanned idempotency_keys for in-progress rows, by created_at.';
