-- Reconciler state of an in-progress row, so that its backoff survives
-- restarts and changes of the instance that reconciles.
--
-- Adding columns with a constant default is a catalog-only change (no table
-- rewrite), so this is quick on a large table.
--
-- The reconciler lists due rows through idempotency_keys_in_progress_idx
-- (in-progress rows by created_at) and filters reconcile_after on the heap:
-- postponed rows are in-progress rows whose real outcome is still unknown,
-- which are few, so no further index is needed.
ALTER TABLE idempotency_keys
    ADD COLUMN reconcile_attempts integer     NOT NULL DEFAULT 0,
    ADD COLUMN reconcile_after    timestamptz NULL;

COMMENT ON COLUMN idempotency_keys.reconcile_attempts IS
    'Reconciliation attempts that could not learn the outcome of this in-progress request.';
COMMENT ON COLUMN idempotency_keys.reconcile_after IS
    'Database time before which the reconciler does not try this in-progress row again; NULL: due now.';
