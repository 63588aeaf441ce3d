-- One row per (user, Idempotency-Key): the fingerprint of the first request,
-- the token of the worker that owns it and, once finished, the stored answer.
CREATE TABLE idempotency_keys (
    user_id          text        NOT NULL,
    key              text        NOT NULL,
    request_hash     bytea       NOT NULL,
    owner_token      bytea       NOT NULL,
    response_status  smallint    NULL,
    response_headers jsonb       NULL,
    response_body    bytea       NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz NULL,

    CONSTRAINT idempotency_keys_pkey PRIMARY KEY (user_id, key),
    CONSTRAINT idempotency_keys_request_hash_check
        CHECK (octet_length(request_hash) = 32),
    CONSTRAINT idempotency_keys_owner_token_check
        CHECK (octet_length(owner_token) = 16),
    CONSTRAINT idempotency_keys_status_check
        CHECK (response_status BETWEEN 100 AND 599),
    CONSTRAINT idempotency_keys_answer_check
        CHECK ((response_status IS NULL) = (completed_at IS NULL))
);

-- Expiry: rows older than the retention are swept oldest first.
CREATE INDEX idempotency_keys_created_at_idx
    ON idempotency_keys (created_at);

-- Reconciler: in-progress rows, oldest first. Small because finished rows
-- are not in it.
CREATE INDEX idempotency_keys_in_progress_idx
    ON idempotency_keys (created_at)
    WHERE response_status IS NULL;

COMMENT ON TABLE idempotency_keys IS
    'Idempotency keys of retried requests: one row per user and key, live for the retention period from created_at.';
COMMENT ON COLUMN idempotency_keys.user_id IS
    'Scope of the key: the authenticated user.';
COMMENT ON COLUMN idempotency_keys.key IS
    'The Idempotency-Key header sent by the client.';
COMMENT ON COLUMN idempotency_keys.request_hash IS
    'SHA-256 fingerprint of the first request sent under this key.';
COMMENT ON COLUMN idempotency_keys.owner_token IS
    'Random token of the worker that claimed the key; only it may complete or release the row.';
COMMENT ON COLUMN idempotency_keys.response_status IS
    'HTTP status of the stored answer; NULL while the request is in progress.';
COMMENT ON COLUMN idempotency_keys.response_headers IS
    'Headers of the stored answer as a JSON object of string arrays.';
COMMENT ON COLUMN idempotency_keys.response_body IS
    'Body of the stored answer.';
COMMENT ON COLUMN idempotency_keys.created_at IS
    'Database time of the claim; the key expires retention after it.';
COMMENT ON COLUMN idempotency_keys.completed_at IS
    'Database time the answer was stored; NULL while in progress.';
