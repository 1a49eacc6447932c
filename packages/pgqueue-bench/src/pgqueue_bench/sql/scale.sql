-- Statements of the scale driver (pgqueue bench scale). Claims, acks, enqueues and
-- metrics go through pgqueue.Queue and the real API app; these statements only load
-- finished history with COPY, clear a run's measured jobs, vacuum, hold back the xmin
-- horizon for the soak, and read sizes and statistics from the catalogs.
--
-- Placeholders: {schema} is the quoted schema of the run. Parameters use psycopg's
-- %(name)s style.

-- name: history_copy
-- Finished jobs as a month of real traffic would have left them. COPY fires the jobs
-- table's statement-level triggers, so the rollups count the history like any insert.
COPY {schema}.jobs (queue, task, payload, priority, state, run_at, attempts, max_attempts,
                    worker_id, enqueued_at, started_at, finished_at, last_error, result)
FROM STDIN;

-- name: measured_jobs_delete
-- Removes a run's measured jobs (every job after the history), so each run starts
-- from the same table.
DELETE FROM {schema}.jobs WHERE id > %(after_id)s;

-- name: jobs_max_id
SELECT coalesce(max(id), 0) AS max_id FROM {schema}.jobs;

-- name: jobs_vacuum
VACUUM (ANALYZE) {schema}.jobs;

-- name: jobs_vacuum_freeze
-- Loaded history is old: in a real table autovacuum would long since have frozen it
-- and marked its pages all-visible.
VACUUM (FREEZE, ANALYZE) {schema}.jobs;

-- name: relation_sizes
-- Every table and index of the schema, and the jobs table's TOAST table.
SELECT c.relname AS name,
       CASE c.relkind WHEN 'i' THEN 'index' ELSE 'table' END AS kind,
       pg_relation_size(c.oid) AS bytes
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'i')
UNION ALL
SELECT 'jobs (toast)', 'toast', coalesce(pg_relation_size(c.reltoastrelid), 0)
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relname = 'jobs'
ORDER BY 1;

-- name: jobs_activity
-- The jobs table's tuple counts and vacuum history (cumulative statistics, which the
-- server publishes with a delay of up to a second or so).
SELECT n_live_tup, n_dead_tup, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del,
       vacuum_count, autovacuum_count, analyze_count, autoanalyze_count
FROM pg_stat_user_tables
WHERE schemaname = %(schema)s AND relname = 'jobs';

-- name: horizon_hold
-- Run in a REPEATABLE READ transaction that then stays open: its snapshot and its
-- transaction id hold back the xmin horizon, as a forgotten transaction, a long report or a
-- long backup would, so no row version that died after it can be removed.
SELECT pg_current_xact_id()::text AS xid, count(*) AS rollup_rows
FROM {schema}.queue_rollups;

-- name: horizon_age
-- How many transactions the oldest snapshot or transaction on the server lags behind.
SELECT coalesce(max(greatest(age(backend_xmin), age(backend_xid))), 0)::bigint AS xmin_age
FROM pg_stat_activity
WHERE backend_xmin IS NOT NULL OR backend_xid IS NOT NULL;

-- name: checkpoint
-- After a load: write its dirty pages now, so the first runs do not pay for them.
CHECKPOINT;

-- name: measured_jobs_pages
-- How many heap pages the measured jobs were written to: as many as fit on a page
-- when the table has room at its end, up to one page per job when free space left in
-- the history's pages draws new rows in.
SELECT count(DISTINCT (ctid::text::point)[0])::bigint AS pages, count(*) AS jobs
FROM {schema}.jobs WHERE id > %(after_id)s;
