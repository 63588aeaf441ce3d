ALTER TABLE idempotency_keys
    DROP COLUMN IF EXISTS reconcile_after,
    DROP COLUMN IF EXISTS reconcile_attempts;
