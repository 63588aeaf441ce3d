DROP VIEW IF EXISTS idempotency_keys_schema;
DROP TABLE IF EXISTS idempotency_keys_leases;
DROP TABLE IF EXISTS idempotency_keys_reconcile;
DROP TABLE IF EXISTS idempotency_keys;
