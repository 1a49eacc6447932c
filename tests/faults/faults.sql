-- Statements the fault scenarios run themselves: the faults and hostile rows they
-- inject. The audit trail they judge a run by is the bench package's
-- (packages/pgqueue-bench/src/pgqueue_bench/sql/audit.sql), shared with the soak. pgqueue's own statements are in
-- packages/pgqueue-core/src/pgqueue/sql/queries.sql; the tests go through Queue for
-- everything a producer, a worker or an operator would do.
--
-- Placeholders: {schema} is the quoted schema of the run. Parameters use psycopg's
-- %(name)s style.

-- name: database_now
SELECT now() AS now;

-- name: tablespace_create
CREATE TABLESPACE {tablespace} LOCATION {location};

-- name: tablespace_drop
DROP TABLESPACE IF EXISTS {tablespace};

-- name: database_create_in_tablespace
CREATE DATABASE {database} TABLESPACE {tablespace};

-- name: database_create
CREATE DATABASE {database};

-- name: database_drop
DROP DATABASE IF EXISTS {database} WITH (FORCE);

-- name: database_setting_set
ALTER DATABASE {database} SET {name} = {value};

-- name: session_without_timeouts
-- For the sessions that inject faults: the server's own timeouts are for the queue.
SET statement_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET lock_timeout = 0;

-- name: jobs_with_keys
-- How many of these idempotency keys made it into the table.
SELECT count(*) AS found FROM {schema}.jobs
WHERE idempotency_key = ANY(%(keys)s::text[]);

-- name: jobs_lock_table
LOCK TABLE {schema}.active_jobs IN ACCESS EXCLUSIVE MODE;

-- name: jobs_lock_rows
-- Holds these jobs' rows until the session's transaction ends.
SELECT id FROM {schema}.active_jobs WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id FOR UPDATE;

-- name: sessions_waiting_on_locks
SELECT count(*) AS waiting FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock';

-- name: jobs_restart_ids
-- The next job id: past 2^31, where a 32-bit integer anywhere in the path would break.
ALTER SEQUENCE {schema}.job_ids RESTART WITH 3000000000;

-- name: job_insert_raw
-- A row written around pgqueue's validation (another client, a hand-made fix, an old
-- version): any jsonb at all as its payload, any attempt counts.
INSERT INTO {schema}.active_jobs (queue, task, payload, attempts, max_attempts)
VALUES ('default', %(task)s, %(payload)s::jsonb, %(attempts)s, %(max_attempts)s)
RETURNING id;

-- name: job_insert_raw_expired
-- The same, as a running job whose worker vanished: its lease expired a second ago.
INSERT INTO {schema}.active_jobs
    (queue, task, payload, state, attempts, max_attempts, lease_token, lease_expires_at,
     worker_id, started_at)
VALUES ('default', %(task)s, %(payload)s::jsonb, 'running', %(attempts)s, %(max_attempts)s,
        gen_random_uuid(), now() - interval '1 second', 'vanished:1:0', now())
RETURNING id;

-- name: job_errors_raw
-- A job's error history written around pgqueue: any jsonb at all.
UPDATE {schema}.active_jobs SET errors = %(errors)s::jsonb WHERE id = %(id)s;

-- name: job_expire_lease
-- Moves a running job's lease into the past, as if its worker had stalled that long.
UPDATE {schema}.active_jobs SET lease_expires_at = now() - interval '1 second'
WHERE id = ANY(%(ids)s::bigint[]) AND state = 'running';

-- name: listening_backends
-- The sessions LISTENing for this schema's jobs: a worker's listening connection runs
-- that one statement and nothing else, so it is what pg_stat_activity shows.
SELECT pid FROM pg_stat_activity
WHERE application_name = 'pgqueue-worker-listen' AND query = %(listen)s
ORDER BY pid;

-- name: replication_sync_states
SELECT application_name, sync_state FROM pg_stat_replication;

-- name: server_in_recovery
SELECT pg_is_in_recovery() AS in_recovery;

-- name: deadlocks_reported
-- Deadlocks the server detected in this database since its statistics were reset.
SELECT deadlocks FROM pg_stat_database WHERE datname = current_database();

-- name: running_per_partition
-- How many jobs of each partition key are running (claimed and not finished) now.
SELECT partition_key, count(*) AS running FROM {schema}.active_jobs
WHERE state = 'running' AND queue = %(queue)s
GROUP BY partition_key;
