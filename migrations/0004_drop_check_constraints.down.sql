-- Restore the CHECK constraints of 0001. Each scans the table once to
-- validate its rows, under a lock that blocks writes.
ALTER TABLE idempotency_keys
    ADD CONSTRAINT idempotency_keys_request_hash_check
        CHECK (octet_length(request_hash) = 32),
    ADD CONSTRAINT idempotency_keys_owner_token_check
        CHECK (octet_length(owner_token) = 16),
    ADD CONSTRAINT idempotency_keys_status_check
        CHECK (response_status BETWEEN 100 AND 599),
    ADD CONSTRAINT idempotency_keys_answer_check
        CHECK ((response_status IS NULL) = (completed_at IS NULL));
