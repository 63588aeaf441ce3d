-- Drop the four CHECK constraints of 0001, which every claim and every
-- answer write paid for, and which only guard against writers other than
-- idem.
--
-- PostgreSQL evaluates a table's CHECK constraints on every INSERT and
-- UPDATE, and prepares them again for every statement it executes: it reads
-- each constraint's stored expression and plans it before the first row.
-- On the hot path (a claim, then an answer write) that was 5% to 7% of the
-- database's work per request, measured with pgbench, closed loop, 8
-- clients, paired runs (docs/capacity.md).
--
-- What they checked is kept by the code that writes the table:
--   request_hash is 32 bytes, owner_token 16: the store binds them from
--     fixed-size arrays (durable.Fingerprint, durable.Token), and reading a
--     row of any other length is an error, never a decision;
--   response_status is 100..599: the store refuses any other status before
--     it writes (ErrInvalid);
--   response_status and completed_at are NULL together: the answer write
--     sets both, no statement clears only one, and every statement that asks
--     "answered yet?" reads response_status.
-- A table written only through durable.Store (or the reconciler) therefore
-- holds no row these constraints would have refused. To keep them anyway,
-- for other writers, apply this migration's down file: it costs the share
-- above.
ALTER TABLE idempotency_keys
    DROP CONSTRAINT IF EXISTS idempotency_keys_request_hash_check,
    DROP CONSTRAINT IF EXISTS idempotency_keys_owner_token_check,
    DROP CONSTRAINT IF EXISTS idempotency_keys_status_check,
    DROP CONSTRAINT IF EXISTS idempotency_keys_answer_check;
