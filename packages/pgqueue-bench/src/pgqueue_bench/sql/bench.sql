-- Statements of the benchmark drivers. pgqueue's tables are never written here: the
-- drivers go through pgqueue.Queue for that, and read them only to check a run.
--
-- Placeholders: {schema} is the quoted schema of the run, {name} and {value} a
-- server setting. Parameters use psycopg's %(name)s style.

-- name: delivery_table_create
-- One row per handler invocation that reached the database, written before the
-- handler's work, so a delivery survives the worker being killed right after it.
CREATE TABLE IF NOT EXISTS {schema}.bench_deliveries (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id       bigint NOT NULL,
    attempt      integer NOT NULL,
    pid          integer NOT NULL,
    delivered_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS bench_deliveries_job_idx ON {schema}.bench_deliveries (job_id);

-- name: delivery_record
INSERT INTO {schema}.bench_deliveries (job_id, attempt, pid)
VALUES (%(job_id)s, %(attempt)s, %(pid)s);

-- name: delivery_summary
-- How many deliveries were recorded, for how many jobs, and the most for one job.
SELECT coalesce(sum(deliveries), 0)::bigint AS delivery_rows,
       count(*) AS jobs_delivered,
       coalesce(max(deliveries), 0)::bigint AS most_deliveries_of_one_job
FROM (
    SELECT job_id, count(*) AS deliveries
    FROM {schema}.bench_deliveries
    GROUP BY job_id
) AS per_job;

-- name: dependency_order
-- A crash run with dependencies: dependents delivered before one of their dependencies
-- had succeeded (a delivery's clock is its own transaction's, which starts after the
-- claim, which follows the commit of the ack that released the job), waiting jobs
-- counted down below zero (released twice), and how many jobs had dependencies.
SELECT
    (SELECT count(DISTINCT dependency.job_id)
     FROM {schema}.job_dependencies AS dependency
     JOIN {schema}.jobs AS waited ON waited.id = dependency.depends_on
     JOIN {schema}.bench_deliveries AS delivery ON delivery.job_id = dependency.job_id
     WHERE waited.state <> 'succeeded' OR delivery.delivered_at < waited.finished_at
    )::bigint AS dependents_delivered_early,
    (SELECT count(*) FROM {schema}.jobs WHERE pending_dependencies < 0)::bigint
        AS dependency_counts_below_zero,
    (SELECT count(DISTINCT job_id) FROM {schema}.job_dependencies)::bigint AS dependent_jobs;

-- name: schema_drop
DROP SCHEMA IF EXISTS {schema} CASCADE;

-- name: database_now
SELECT now() AS now;

-- name: server_version
SELECT version() AS version, current_setting('server_version_num')::int AS version_num;

-- name: server_settings
-- current_setting() gives each value with its unit, as SHOW does ("128MB", "5min").
SELECT name, current_setting(name) AS setting
FROM pg_settings WHERE name = ANY(%(names)s::text[]) ORDER BY name;

-- name: server_started_at
SELECT pg_postmaster_start_time() AS started_at, now() AS now;

-- name: server_setting_set
ALTER SYSTEM SET {name} = {value};

-- name: server_setting_reset
ALTER SYSTEM RESET {name};

-- name: server_reload
SELECT pg_reload_conf() AS reloaded;

-- name: server_in_recovery
SELECT pg_is_in_recovery() AS in_recovery;

-- name: backend_pid
SELECT pg_backend_pid() AS pid;

-- name: backend_pids
-- Client backends other than this one, optionally only those of one application.
SELECT pid FROM pg_stat_activity
WHERE backend_type = 'client backend'
  AND pid <> pg_backend_pid()
  AND (%(application_name)s::text IS NULL OR application_name = %(application_name)s)
ORDER BY pid;

-- name: backend_terminate
SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) AS terminated
FROM pg_stat_activity
WHERE backend_type = 'client backend'
  AND pid <> pg_backend_pid()
  AND (%(application_name)s::text IS NULL OR application_name = %(application_name)s);

-- name: database_create
CREATE DATABASE {database};

-- name: database_drop
DROP DATABASE IF EXISTS {database} WITH (FORCE);
