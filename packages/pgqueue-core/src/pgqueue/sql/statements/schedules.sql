-- Schedules: cron schedules, their sync and their due ticks.
-- Placeholders and parameters: see pgqueue/queries.py.

-- name: scheduler_try_lock
-- The scheduler's turn: one process at a time reads the due schedules, enqueues their
-- ticks and moves them on, all in this transaction. Transaction-scoped, like the
-- reaper's, so it is safe behind PgBouncer and dies with a killed worker's session; one
-- that froze inside it is ended after 5 s idle.
SELECT pg_try_advisory_xact_lock(%(key)s) AS locked,
       set_config('idle_in_transaction_session_timeout', '5s', true) AS idle_limit;

-- name: schedule_sync_lock
-- A worker's sync of its plugins' schedules waits for the scheduler's turn (same key),
-- so syncs and runs never interleave, and workers starting together sync one at a time.
SELECT pg_advisory_xact_lock(%(key)s),
       set_config('idle_in_transaction_session_timeout', '5s', true) AS idle_limit;

-- name: schedules_due
-- The enabled schedules whose tick has come on the database's clock, locked until the
-- transaction that enqueues their jobs commits, with that clock's reading.
WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS now)
SELECT schedule.name, schedule.cron, schedule.timezone, schedule.task, schedule.queue,
       schedule.payload, schedule.priority, schedule.max_attempts, schedule.next_run_at,
       schedule.error, clock.now
FROM {schema}.schedules AS schedule, clock
WHERE schedule.enabled
  AND (schedule.next_run_at IS NULL OR schedule.next_run_at <= clock.now)
ORDER BY schedule.name
FOR UPDATE OF schedule;

-- name: schedules_ran
-- Moves each schedule on to its next tick, and records its run (a NULL job_id: the
-- tick had its job already, or next_run_at was only filled in), or, with an error, why
-- the round skipped it (its next_run_at is then when a round looks at it again).
UPDATE {schema}.schedules AS schedule
SET next_run_at = ran.next_run_at,
    last_run_at = CASE WHEN ran.job_id IS NULL THEN schedule.last_run_at ELSE ran.run_at END,
    last_tick_at = CASE WHEN ran.job_id IS NULL THEN schedule.last_tick_at ELSE ran.tick_at END,
    last_job_id = coalesce(ran.job_id, schedule.last_job_id),
    error = ran.error
FROM unnest(%(names)s::text[], %(next_run_ats)s::timestamptz[], %(run_ats)s::timestamptz[],
            %(tick_ats)s::timestamptz[], %(job_ids)s::bigint[], %(errors)s::text[])
     AS ran(name, next_run_at, run_at, tick_at, job_id, error)
WHERE schedule.name = ran.name;

-- name: schedule_next_due
-- Seconds until the next tick of any enabled schedule (NULL: none), for the scheduler
-- to sleep until then.
SELECT extract(epoch FROM min(next_run_at) - clock_timestamp())::float8 AS seconds
FROM {schema}.schedules
WHERE enabled;

-- name: schedule_list
SELECT * FROM {schema}.schedules ORDER BY name;

-- name: schedule_list_locked
-- Every schedule, locked for a sync, with the database's clock.
SELECT schedule.*, clock_timestamp() AS now
FROM {schema}.schedules AS schedule
ORDER BY name
FOR UPDATE;

-- name: schedule_get_locked
SELECT schedule.*, clock_timestamp() AS now
FROM {schema}.schedules AS schedule
WHERE name = %(name)s
FOR UPDATE;

-- name: schedule_insert
INSERT INTO {schema}.schedules
    (name, cron, timezone, task, queue, payload, priority, max_attempts, source, next_run_at)
VALUES (%(name)s, %(cron)s, %(timezone)s, %(task)s, %(queue)s, %(payload)s::jsonb,
        %(priority)s, %(max_attempts)s, %(source)s, %(next_run_at)s);

-- name: schedule_redefine
-- A declared schedule whose definition changed, or which was removed and is declared
-- again; the sync decides enabled, disabled_by and next_run_at. A scheduler's error
-- was about the old definition: the new one, checked by the sync, has none yet.
UPDATE {schema}.schedules
SET cron = %(cron)s, timezone = %(timezone)s, task = %(task)s, queue = %(queue)s,
    payload = %(payload)s::jsonb, priority = %(priority)s, max_attempts = %(max_attempts)s,
    source = %(source)s, enabled = %(enabled)s, disabled_by = %(disabled_by)s,
    next_run_at = %(next_run_at)s, removed_at = NULL, error = NULL, updated_at = now()
WHERE name = %(name)s;

-- name: schedule_remove
-- Schedules their plugin no longer declares: disabled (by the sync, unless the operator
-- had already), never deleted.
UPDATE {schema}.schedules
SET removed_at = now(),
    enabled = false,
    disabled_by = CASE WHEN enabled THEN 'sync' ELSE disabled_by END,
    next_run_at = NULL,
    updated_at = now()
WHERE name = ANY(%(names)s::text[]);

-- name: schedule_set_enabled
-- Enabling starts from a tick the caller worked out, so a scheduler's error, about a
-- row it could not read, no longer holds until a round looks again.
UPDATE {schema}.schedules
SET enabled = %(enabled)s,
    disabled_by = CASE WHEN %(enabled)s THEN NULL ELSE 'operator' END,
    next_run_at = %(next_run_at)s,
    error = CASE WHEN %(enabled)s THEN NULL ELSE error END,
    updated_at = now()
WHERE name = %(name)s
RETURNING *;

-- name: schedule_last_runs
-- For /metrics: when each schedule's last job was enqueued (a few rows).
SELECT name, extract(epoch FROM last_run_at)::float8 AS last_run
FROM {schema}.schedules
WHERE last_run_at IS NOT NULL
ORDER BY name;

-- Jobs that wait for other jobs (see pgqueue.dependencies) ------------------------
