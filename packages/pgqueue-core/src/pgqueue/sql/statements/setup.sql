-- Setup: migrations, and the database's clock and liveness.
-- Placeholders and parameters: see pgqueue/queries.py.

-- name: migration_lock
SELECT pg_advisory_xact_lock(%(key)s);

-- name: migration_table_create
CREATE TABLE IF NOT EXISTS {schema}.migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migration_applied
SELECT version, name FROM {schema}.migrations ORDER BY version;

-- name: migration_record
INSERT INTO {schema}.migrations (version, name) VALUES (%(version)s, %(name)s);

-- name: database_now
SELECT now() AS now;

-- name: database_ping
-- The health check: the server answers a query.
SELECT 1 AS ok;
