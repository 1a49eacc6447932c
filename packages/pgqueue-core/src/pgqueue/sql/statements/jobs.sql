-- Jobs: reading them, cancel and retry, and waiting for them to finish.
-- Placeholders and parameters: see pgqueue/queries.py.

-- name: job_cancel
-- waiting | queued | running -> cancelled, moved to finished_jobs. Taking the row out
-- of active_jobs fences out a running worker: its outcome finds no lease to finish.
-- finished_at is the clock once the row is taken, not now(): the statement may have
-- waited for the row (a claim of it committing), and the job's timeline must not end
-- before it started.
WITH cancelled AS (
    DELETE FROM {schema}.active_jobs
    WHERE id = %(id)s AND state IN ('waiting', 'queued', 'running')
    RETURNING *
),
moved AS (
    INSERT INTO {schema}.finished_jobs
        (id, queue, task, payload, priority, state, run_at, attempts, max_attempts,
         timeout_seconds, worker_id, enqueued_at, started_at, finished_at, last_error,
         result, idempotency_key, errors, trace_context, unique_key, pending_dependencies,
         has_dependents, tags, progress, partition_key)
    SELECT id, queue, task, payload, priority, 'cancelled', run_at, attempts, max_attempts,
           timeout_seconds, worker_id, enqueued_at, started_at, clock_timestamp(), last_error,
           result, idempotency_key, errors, trace_context, unique_key, pending_dependencies,
           has_dependents, tags, progress, partition_key
    FROM cancelled
    RETURNING *
),
picked_up AS (
    -- A running job's attempt ends here: its pickup wait joins the histogram, as in
    -- job_finish_many.
    INSERT INTO {schema}.pickup_buckets AS bucket (queue, le, slot, attempts, seconds)
    SELECT queue, le[position + (position = 0 OR seconds > le[position])::int],
           {schema}.counter_slot(), 1, seconds
    FROM (
        SELECT queue, seconds, le, width_bucket(seconds, le) AS position
        FROM (
            SELECT queue, {schema}.pickup_seconds(started_at, enqueued_at, run_at) AS seconds
            FROM cancelled
            WHERE state = 'running'
        ) AS waited,
        (SELECT {schema}.pickup_bounds() AS le) AS bounds
    ) AS placed
    ON CONFLICT (queue, le, slot) DO UPDATE
    SET attempts = bucket.attempts + excluded.attempts,
        seconds = bucket.seconds + excluded.seconds
),
counted AS (
    INSERT INTO {schema}.queue_counters AS counter (queue, slot, cancelled)
    SELECT queue, {schema}.counter_slot(), 1 FROM cancelled
    ON CONFLICT (queue, slot) DO UPDATE SET cancelled = counter.cancelled + 1
),
watched AS (
    -- The cancelled jobs that someone waits for, announced as in job_finish_many.
    SELECT pg_notify({done_channel_name}, cancelled.id::text)
    FROM cancelled
    WHERE EXISTS (SELECT FROM {schema}.job_waiters)
      AND EXISTS (SELECT FROM {schema}.job_waiters AS waiter WHERE waiter.job_id = cancelled.id)
)
SELECT * FROM moved
WHERE (SELECT count(*) FROM watched) >= 0;

-- name: job_retry
-- dead | cancelled -> queued, moved back to active_jobs, runnable now, with its
-- attempts reset; or -> waiting, for a job with dependencies, which the same
-- transaction then checks (dependents_check): queued at once if they all succeeded,
-- waiting for the others otherwise, and refused if one ended dead or cancelled. The
-- dependents cancelled when this job failed stay cancelled. Its errors history and
-- last_error stay. A unique key that another queued or running job holds now fails the
-- statement (unique_violation on active_jobs_unique_key_idx), and nothing changes:
-- Queue.retry names the holder.
WITH revived AS (
    DELETE FROM {schema}.finished_jobs
    WHERE id = %(id)s AND state IN ('dead', 'cancelled')
    RETURNING *
),
requeued AS (
    INSERT INTO {schema}.active_jobs
        (id, queue, task, payload, priority, state, run_at, attempts, max_attempts,
         timeout_seconds, enqueued_at, started_at, last_error, idempotency_key, errors,
         trace_context, unique_key, has_dependents, tags, progress, partition_key)
    SELECT id, queue, task, payload, priority,
           CASE WHEN EXISTS (SELECT FROM {schema}.job_dependencies AS link
                             WHERE link.job_id = revived.id)
                THEN 'waiting' ELSE 'queued' END::{schema}.job_state,
           now(), 0, max_attempts, timeout_seconds, enqueued_at, started_at, last_error,
           idempotency_key, errors, trace_context, unique_key, has_dependents, tags,
           progress, partition_key
    FROM revived
    RETURNING *
),
waiting AS (
    INSERT INTO {schema}.dependents_to_check (job_id)
    SELECT id FROM requeued WHERE state = 'waiting'
),
rewaited AS (
    -- Its dependents in 'finished' mode that still wait counted it off when it ended:
    -- they wait for it again, so that its next end is counted once. (Those released
    -- already are not brought back.) Lower ids first, as every statement locks jobs;
    -- through a function of the schema's owner, since a producer's retry comes here.
    SELECT {schema}.finished_dependents_recounted(
        ARRAY(SELECT link.job_id FROM {schema}.job_dependencies AS link
              WHERE link.depends_on = (SELECT id FROM requeued) AND link.finished_mode
              ORDER BY link.job_id),
        ARRAY(SELECT 1 FROM {schema}.job_dependencies AS link
              WHERE link.depends_on = (SELECT id FROM requeued) AND link.finished_mode
              ORDER BY link.job_id)
    )
),
counted AS (
    INSERT INTO {schema}.queue_counters AS counter (queue, slot, dead, cancelled)
    SELECT queue, {schema}.counter_slot(),
           -count(*) FILTER (WHERE state = 'dead'), -count(*) FILTER (WHERE state = 'cancelled')
    FROM revived GROUP BY queue
    ON CONFLICT (queue, slot) DO UPDATE
    SET dead = counter.dead + excluded.dead, cancelled = counter.cancelled + excluded.cancelled
),
woken AS (
    -- Wakes the workers waiting on these queues (see queue_waiters in schema.sql): one
    -- notification per queue with a live waiter, naming the queue, never a payload,
    -- sent when the transaction commits. Read once, by the subquery below.
    SELECT pg_notify({channel_name}, wanted.queue)
    FROM (SELECT DISTINCT queue FROM requeued WHERE state = 'queued') AS wanted
    WHERE EXISTS (
        SELECT FROM {schema}.queue_waiters AS waiter
        WHERE waiter.queue = wanted.queue AND waiter.expires_at > now()
    )
)
-- With the state it was retried from, for a retry that its dependencies refuse.
SELECT requeued.*, revived.state::text AS retried_from
FROM requeued JOIN revived USING (id)
WHERE (SELECT count(*) FROM woken) >= 0 AND (SELECT count(*) FROM rewaited) >= 0;

-- name: job_get
SELECT * FROM {schema}.jobs WHERE id = %(id)s;

-- name: job_get_many
SELECT * FROM {schema}.jobs WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id;

-- name: job_list
-- Newest first; {filters} holds one "AND column = %(column)s" per filter given (see
-- Queue.list), so that a state filter prunes finished_jobs' partitions.
SELECT * FROM {schema}.jobs
WHERE true {filters}
ORDER BY id DESC
LIMIT %(limit)s;

-- name: job_search
-- job_list with a tag or payload filter ({filters} as there, with "tags @> ..." and
-- "payload @> ..."). The queued and running jobs that match are found first, through
-- active_jobs_tags_idx or active_jobs_payload_idx: the planner cannot tell how few
-- rows a containment matches, and as one query over the jobs view it may prefer to walk
-- the primary key newest first, filtering, which reads the whole backlog when the
-- matches are few. The finished jobs are read newest first, each partition through its
-- id index, until the page is full or history runs out (no index serves the filter
-- there). A state filter leaves out the half that cannot hold that state.
WITH active AS MATERIALIZED (
    SELECT * FROM {schema}.active_jobs WHERE true {filters}
)
SELECT * FROM (
    (SELECT * FROM active ORDER BY id DESC LIMIT %(limit)s)
    UNION ALL
    (SELECT * FROM {schema}.finished_jobs WHERE true {filters} ORDER BY id DESC
     LIMIT %(limit)s)
) AS found
ORDER BY id DESC
LIMIT %(limit)s;

-- name: job_get_by_idempotency_key
-- The job holding an idempotency key: one primary-key lookup, then one by id.
SELECT job.* FROM {schema}.idempotency_keys AS taken
JOIN {schema}.jobs AS job ON job.id = taken.job_id
WHERE taken.key = %(key)s;

-- name: job_waiters_listen
-- Subscribes a job watcher's session (see pgqueue.job_watch) to the channel on which
-- finished jobs that someone waits for are announced (see job_waiters in schema.sql).
LISTEN {done_channel};

-- name: job_waiters_register
-- A watcher waits for these jobs, until expires_at: its rows are written, or renewed
-- (every few seconds while it waits). It then reads their states (job_waiters_states)
-- in a transaction of its own: a job whose finishing statement began before this row
-- was committed is not announced, but that statement has either committed by then, and
-- the job reads as final, or is still under way, a rare race that the watcher's slow
-- re-check of every job it waits for settles.
INSERT INTO {schema}.job_waiters AS waiting (job_id, waiter, expires_at)
SELECT job_id, %(waiter)s, now() + make_interval(secs => %(seconds)s)
FROM unnest(%(ids)s::bigint[]) AS job_id
ORDER BY job_id
ON CONFLICT (job_id, waiter) DO UPDATE SET expires_at = excluded.expires_at;

-- name: job_waiters_states
-- The state of each of these jobs that exists, for a watcher: one index lookup each.
SELECT id, state::text AS state FROM {schema}.jobs WHERE id = ANY(%(ids)s::bigint[]);

-- name: job_waiters_forget
-- A watcher no longer waits for these jobs (or for any, as it stops).
DELETE FROM {schema}.job_waiters
WHERE waiter = %(waiter)s
  AND (%(ids)s::bigint[] IS NULL OR job_id = ANY(%(ids)s::bigint[]));

-- name: job_waiters_expired_delete
-- The rows of watchers that stopped without saying so (killed, cut off): harmless while
-- they last (the jobs they name are announced when they finish), removed by the reaper
-- and by every watcher's renewal.
DELETE FROM {schema}.job_waiters
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM {schema}.job_waiters
    WHERE expires_at < now()
    FOR UPDATE SKIP LOCKED
));
