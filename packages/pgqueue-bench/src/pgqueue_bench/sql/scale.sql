-- Statements of the scale driver (pgqueue bench scale). Claims, acks, enqueues,
-- metrics and retention go through pgqueue.Queue and the real API app; these
-- statements only load finished history with COPY, clear a run's measured jobs,
-- vacuum, hold back the xmin horizon for the soak, and read sizes and statistics from
-- the catalogs.
--
-- Placeholders: {schema} is the quoted schema of the run. Parameters use psycopg's
-- %(name)s style.

-- name: history_ids_reserve
-- A block of %(count)s ids from the job id sequence for one load, returned as its
-- first id: the loaded jobs carry their ids in the COPY (finished_jobs.id has no
-- default), and jobs enqueued later get greater ones. Nothing else takes ids while
-- the history loads.
SELECT setval('{schema}.job_ids', nextval('{schema}.job_ids') + %(count)s - 1)
       - %(count)s + 1 AS first_id;

-- name: history_copy
-- Finished jobs as a month of real traffic would have left them. Each row goes to its
-- state's partition for the day of its finished_at (the days are created before).
COPY {schema}.finished_jobs (id, queue, task, payload, priority, state, run_at, attempts,
                             max_attempts, worker_id, enqueued_at, started_at,
                             finished_at, last_error, result)
FROM STDIN;

-- name: history_count
-- After a load: its jobs added to their queues' counters, as the statements that
-- finish jobs would have added them (a COPY bypasses them), so that /metrics and
-- stats count the history: finished jobs by state, attempts that succeeded (one per
-- succeeded job) and attempts that failed (the failed ones of a succeeded job, every
-- one of a dead job).
INSERT INTO {schema}.queue_counters AS counter
    (queue, slot, succeeded, dead, cancelled, completed, failures)
SELECT queue, 0,
       count(*) FILTER (WHERE state = 'succeeded'),
       count(*) FILTER (WHERE state = 'dead'),
       count(*) FILTER (WHERE state = 'cancelled'),
       count(*) FILTER (WHERE state = 'succeeded'),
       coalesce(sum(attempts - 1) FILTER (WHERE state = 'succeeded'), 0)
       + coalesce(sum(attempts) FILTER (WHERE state = 'dead'), 0)
FROM {schema}.finished_jobs
WHERE id BETWEEN %(first_id)s AND %(last_id)s
GROUP BY queue
ORDER BY queue
ON CONFLICT (queue, slot) DO UPDATE
SET succeeded = counter.succeeded + excluded.succeeded,
    dead = counter.dead + excluded.dead,
    cancelled = counter.cancelled + excluded.cancelled,
    completed = counter.completed + excluded.completed,
    failures = counter.failures + excluded.failures;

-- name: measured_jobs_delete
-- Removes a run's measured jobs (every job with an id above the last one taken
-- before the run) from both tables, and takes the finished ones off their queues'
-- counters again, so each run starts from the same tables and the same counts. The
-- attempt counters (completed, failures) keep counting, as they always do.
WITH active AS (
    DELETE FROM {schema}.active_jobs WHERE id > %(after_id)s
),
finished AS (
    DELETE FROM {schema}.finished_jobs WHERE id > %(after_id)s
    RETURNING queue, state
)
INSERT INTO {schema}.queue_counters AS counter (queue, slot, succeeded, dead, cancelled)
SELECT queue, 0,
       -count(*) FILTER (WHERE state = 'succeeded'),
       -count(*) FILTER (WHERE state = 'dead'),
       -count(*) FILTER (WHERE state = 'cancelled')
FROM finished
GROUP BY queue
ORDER BY queue
ON CONFLICT (queue, slot) DO UPDATE
SET succeeded = counter.succeeded + excluded.succeeded,
    dead = counter.dead + excluded.dead,
    cancelled = counter.cancelled + excluded.cancelled;

-- name: job_ids_last
-- The last id the job id sequence handed out (0 before the first): every job
-- enqueued after this reading has a greater id, wherever it is by then.
SELECT CASE WHEN is_called THEN last_value ELSE 0 END AS last_id FROM {schema}.job_ids;

-- name: active_jobs_vacuum
-- Between runs: the hot table and the counters every ack writes.
VACUUM (ANALYZE) {schema}.active_jobs, {schema}.queue_counters;

-- name: finished_jobs_vacuum
-- Between runs: the measured jobs deleted from today's partitions. Every partition is
-- visited, but the frozen history's pages are skipped through the visibility map;
-- no ANALYZE, which would sample every day again.
VACUUM {schema}.finished_jobs;

-- name: finished_jobs_before
-- How many finished jobs finished before %(before)s: the jobs a retention that expires
-- the days ending by then must remove, counted before it runs. Reads only those days'
-- partitions (and the DEFAULT ones, normally empty).
SELECT count(*) AS jobs FROM {schema}.finished_jobs WHERE finished_at < %(before)s;

-- name: history_vacuum_freeze
-- Loaded history is old: in a real database autovacuum would long since have frozen
-- it and marked its pages all-visible.
VACUUM (FREEZE, ANALYZE) {schema}.finished_jobs, {schema}.queue_counters;

-- name: relation_sizes
-- Every table, partition and index of the schema (partitioned tables and indexes hold
-- no data of their own: 0 bytes), with the table each belongs to (an index's table, a
-- partition's root) and its TOAST table's size.
SELECT c.relname AS name,
       CASE c.relkind
           WHEN 'r' THEN 'table'
           WHEN 'p' THEN 'partitioned table'
           WHEN 'i' THEN 'index'
           ELSE 'partitioned index'
       END AS kind,
       coalesce(root.relname, t.relname) AS of_table,
       pg_relation_size(c.oid) AS bytes,
       coalesce(pg_relation_size(nullif(c.reltoastrelid, 0)), 0) AS toast_bytes
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_index AS i ON i.indexrelid = c.oid
JOIN pg_class AS t ON t.oid = coalesce(i.indrelid, c.oid)
LEFT JOIN pg_class AS root ON root.oid = pg_partition_root(t.oid)
WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'i', 'I')
ORDER BY c.relname;

-- name: jobs_activity
-- Tuple counts and vacuum history of active_jobs, and of finished_jobs summed over its
-- partitions (cumulative statistics, which a server publishes up to a second or so
-- after the work, or when the session that did it ends).
SELECT CASE WHEN s.relname = 'active_jobs' THEN 'active_jobs' ELSE 'finished_jobs' END
           AS jobs_table,
       count(*)::bigint AS tables,
       sum(s.n_live_tup)::bigint AS n_live_tup,
       sum(s.n_dead_tup)::bigint AS n_dead_tup,
       sum(s.n_tup_ins)::bigint AS n_tup_ins,
       sum(s.n_tup_upd)::bigint AS n_tup_upd,
       sum(s.n_tup_hot_upd)::bigint AS n_tup_hot_upd,
       sum(s.n_tup_del)::bigint AS n_tup_del,
       sum(s.vacuum_count)::bigint AS vacuum_count,
       sum(s.autovacuum_count)::bigint AS autovacuum_count,
       sum(s.analyze_count)::bigint AS analyze_count,
       sum(s.autoanalyze_count)::bigint AS autoanalyze_count
FROM pg_stat_user_tables AS s
JOIN pg_class AS c ON c.oid = s.relid AND c.relkind = 'r'
WHERE s.schemaname = %(schema)s
  AND (s.relname = 'active_jobs'
       OR pg_partition_root(s.relid) = '{schema}.finished_jobs'::regclass)
GROUP BY 1
ORDER BY 1;

-- name: horizon_hold
-- Run in a REPEATABLE READ transaction that then stays open: its snapshot and its
-- transaction id hold back the xmin horizon, as a forgotten transaction, a long report or a
-- long backup would, so no row version that died after it can be removed.
SELECT pg_current_xact_id()::text AS xid, count(*) AS counter_rows
FROM {schema}.queue_counters;

-- name: horizon_age
-- How many transactions the oldest snapshot or transaction on the server lags behind.
SELECT coalesce(max(greatest(age(backend_xmin), age(backend_xid))), 0)::bigint AS xmin_age
FROM pg_stat_activity
WHERE backend_xmin IS NOT NULL OR backend_xid IS NOT NULL;

-- name: checkpoint
-- After a load: write its dirty pages now, so the first runs do not pay for them.
CHECKPOINT;

-- name: measured_jobs_pages
-- How many heap pages of active_jobs the measured jobs were written to, before any is
-- claimed: as many as fit on a page when the table has room at its end, up to one
-- page per job when free space scattered through the table draws new rows in.
SELECT count(DISTINCT (ctid::text::point)[0])::bigint AS pages, count(*) AS jobs
FROM {schema}.active_jobs WHERE id > %(after_id)s;
