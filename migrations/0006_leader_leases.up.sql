-- Leadership of the jobs that run on one instance at a time across a fleet
-- (the reconciler and the sweeper): one lease row per job, holding who leads
-- and until when, by the database's clock.
--
-- A lease is taken, renewed and given back by one autocommit statement each
-- (durable.Leader), so leadership is not tied to a server session and works
-- through any connection pooler, PgBouncer in transaction mode included.
-- It replaces the session advisory locks, which a transaction-mode pooler
-- takes and releases on different server sessions.
--
-- Independent of every other migration: it creates one small table and
-- touches nothing else.
CREATE TABLE idempotency_keys_leases (
    job        text        PRIMARY KEY,
    holder     text        NOT NULL,
    expires_at timestamptz NOT NULL
);

COMMENT ON TABLE idempotency_keys_leases IS
    'Who leads each periodic job (reconcile, sweep) on idempotency_keys, and until when (database time).';
