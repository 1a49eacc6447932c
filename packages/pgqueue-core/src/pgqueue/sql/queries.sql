-- Every statement pgqueue runs, named Entity+Verb. Each state transition is one
-- statement, guarded by the state it leaves (and by the lease token where a worker
-- holds the job), and reads only the database clock.
--
-- Placeholders: {schema} is the quoted schema name, {lock} the row-lock clause of a
-- claim. Parameters use psycopg's %(name)s style.

-- name: job_insert
INSERT INTO {schema}.jobs
    (queue, task, payload, priority, run_at, max_attempts, timeout_seconds, idempotency_key)
VALUES
    (%(queue)s, %(task)s, %(payload)s, %(priority)s,
     COALESCE(%(run_at)s, now() + make_interval(secs => %(delay_seconds)s)),
     %(max_attempts)s, %(timeout_seconds)s, %(idempotency_key)s)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING *;

-- name: job_get_by_idempotency_key
SELECT * FROM {schema}.jobs WHERE idempotency_key = %(idempotency_key)s;

-- name: job_insert_many
-- Rows go in in request order, so identity values follow it.
INSERT INTO {schema}.jobs
    (queue, task, payload, priority, run_at, max_attempts, timeout_seconds, idempotency_key)
SELECT queue, task, payload, priority,
       COALESCE(run_at, now() + make_interval(secs => delay_seconds)),
       max_attempts, timeout_seconds, idempotency_key
FROM unnest(
    %(queue)s::text[], %(task)s::text[], %(payload)s::jsonb[], %(priority)s::smallint[],
    %(run_at)s::timestamptz[], %(delay_seconds)s::float8[], %(max_attempts)s::int[],
    %(timeout_seconds)s::float8[], %(idempotency_key)s::text[]
) WITH ORDINALITY AS item (queue, task, payload, priority, run_at, delay_seconds,
                           max_attempts, timeout_seconds, idempotency_key, position)
ORDER BY position
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING *;

-- name: job_get_many_by_idempotency_key
-- For each item whose key was taken (by an earlier item of the same insert, or by a job
-- already in the table), the job holding the key and which of task, queue and payload
-- differ from the item's. Payloads are compared as jsonb, so key order, white space and
-- the spelling of numbers do not count as differences. One row per item found, with its
-- position, counted from 1, in the arrays given.
SELECT job.*, item.position,
       array_remove(ARRAY[
           CASE WHEN job.task <> item.task THEN 'task' END,
           CASE WHEN job.queue <> item.queue THEN 'queue' END,
           CASE WHEN job.payload <> item.payload THEN 'payload' END
       ], NULL) AS differs
FROM unnest(%(idempotency_keys)s::text[], %(tasks)s::text[], %(queues)s::text[],
            %(payloads)s::jsonb[])
     WITH ORDINALITY AS item (key, task, queue, payload, position)
JOIN {schema}.jobs AS job
  ON job.idempotency_key = item.key AND job.idempotency_key IS NOT NULL;

-- name: job_delete_created
-- Takes back jobs that the caller's own transaction has just inserted (an enqueue_many
-- refused for an idempotency conflict), so that the caller may still commit the rest of
-- its work without them. Nobody else has seen them: they are not committed.
DELETE FROM {schema}.jobs WHERE id = ANY(%(ids)s::bigint[]);

-- name: job_claim
-- queued -> running for up to %(limit)s runnable jobs in claim order. Each claim is a
-- new attempt with a fresh lease token.
-- One index scan per queue, in jobs_claim_idx order, so a claim reads a handful of
-- index entries however long the backlog (a single scan over queue = ANY(...) cannot
-- use the index order, and would sort every queued row). With several queues each
-- scan locks up to %(limit)s rows and the best %(limit)s overall are claimed; the
-- others stay queued and are unlocked at commit.
WITH claimable AS (
    SELECT candidate.id
    FROM unnest(%(queues)s::text[]) AS wanted (queue)
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM {schema}.jobs
        WHERE state = 'queued'
          AND queue = wanted.queue
          AND task = ANY(%(tasks)s::text[])
          AND run_at <= now()
        ORDER BY priority DESC, run_at, id
        LIMIT %(limit)s
        {lock}
    ) AS candidate
    ORDER BY candidate.priority DESC, candidate.run_at, candidate.id
    LIMIT %(limit)s
)
UPDATE {schema}.jobs AS job
SET state = 'running',
    -- Saturating: a row written around pgqueue with attempts at the integer limit
    -- still runs (and goes dead if it fails) instead of failing every claim of its
    -- queue with "integer out of range".
    attempts = least(job.attempts, 2147483646) + 1,
    lease_token = gen_random_uuid(),
    lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
    worker_id = %(worker_id)s,
    started_at = now()
-- By primary key, one row at a time: a join to the claimed ids lets the planner hash
-- them and scan the whole table, which grows with the history the table holds.
WHERE job.id = ANY(ARRAY(SELECT id FROM claimable))
-- Every column that differs between the claimed rows, in the order of pgqueue.Job's
-- fields, the payload as text: the worker loads a whole claim's payloads with one JSON
-- parse, instead of one per row through the driver. The columns this statement sets
-- alike for every row (state, worker_id, started_at, lease_expires_at) come once, from
-- job_claim_times in the same transaction: a claim returns hundreds of rows, and each
-- timestamp costs the server and the client a conversion per row.
RETURNING job.id, job.queue, job.task, job.payload::text AS payload, job.priority,
          job.run_at, job.attempts, job.max_attempts, job.timeout_seconds,
          job.lease_token, job.enqueued_at, job.finished_at, job.last_error, job.errors,
          job.result, job.idempotency_key;

-- name: job_claim_times
-- started_at and lease_expires_at as job_claim set them, run in its transaction after
-- it: now() is the transaction's start time, and the expression is the claim's own.
SELECT now() AS started_at, now() + make_interval(secs => %(lease_seconds)s) AS lease_expires_at;

-- name: job_heartbeat_many
-- Extends every lease still held, and returns the ids of the leases that were lost.
-- A heartbeat never waits for a row lock: a row another transaction holds is being
-- acked, failed, cancelled or reaped right now, so its lease is either about to end or
-- still held, and the next beat finds out which (leases outlive several beats). Waiting
-- would let a heartbeat and an ack of the same leases, each holding rows the other
-- needs, deadlock whenever the two statements' plans visit the rows in different orders.
WITH lease AS (
    SELECT id, token FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS lease (id, token)
),
held AS (
    SELECT job.id FROM {schema}.jobs AS job JOIN lease USING (id)
    WHERE job.lease_token = lease.token AND job.state = 'running'
    FOR UPDATE OF job SKIP LOCKED
),
extended AS (
    UPDATE {schema}.jobs AS job
    SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
    FROM held
    WHERE job.id = held.id
    RETURNING job.id
)
-- Lost: neither extended nor, as this statement's snapshot saw it, still ours and
-- merely locked by someone else.
SELECT lease.id FROM lease
WHERE NOT EXISTS (SELECT FROM extended WHERE extended.id = lease.id)
  AND NOT EXISTS (
      SELECT FROM {schema}.jobs AS job
      WHERE job.id = lease.id AND job.lease_token = lease.token AND job.state = 'running'
  );

-- name: job_ack_many
-- running -> succeeded, for the leases still held. Returns one row: the finish time
-- (the transaction's, shared by every ack of the statement) and the positions, counted
-- from 1 in the arrays given, of the outcomes that were refused because their lease was
-- no longer held. Nothing per acked job comes back: the worker already holds the rest
-- of each row. One batch may carry two outcomes of the same job (a stale attempt's and
-- the one that re-claimed it after a cancel and retry, or a reap); only the holder of
-- the current token is acked.
WITH done AS (
    -- The outcomes arrive as three texts, an id array, a token array and a JSON array
    -- of results, zipped back into rows here: a worker sends thousands a second, and
    -- three strings cost the client a fraction of three arrays dumped element by
    -- element.
    SELECT id, token, result, position
    FROM ROWS FROM (
        unnest(%(ids)s::bigint[]),
        unnest(%(tokens)s::uuid[]),
        jsonb_array_elements(%(results)s::jsonb)
    ) WITH ORDINALITY AS outcome (id, token, result, position)
),
acked AS (
    UPDATE {schema}.jobs AS job
    SET state = 'succeeded',
        result = done.result,
        finished_at = now(),
        -- The errors of earlier attempts stay in errors; last_error is for jobs that
        -- have not succeeded.
        last_error = NULL,
        lease_token = NULL,
        lease_expires_at = NULL
    FROM done
    WHERE job.id = done.id AND job.lease_token = done.token AND job.state = 'running'
    RETURNING done.position
)
SELECT now() AS finished_at,
       ARRAY(
           SELECT position FROM done
           WHERE position NOT IN (SELECT position FROM acked)
           ORDER BY position
       ) AS refused;

-- name: job_fail
-- running -> queued after a backoff, or -> dead once the attempts are used up.
UPDATE {schema}.jobs AS job
SET state = CASE WHEN job.attempts >= job.max_attempts
                 THEN 'dead' ELSE 'queued' END::{schema}.job_state,
    run_at = CASE WHEN job.attempts >= job.max_attempts
                  THEN job.run_at ELSE now() + make_interval(secs => %(retry_delay)s) END,
    finished_at = CASE WHEN job.attempts >= job.max_attempts THEN now() END,
    last_error = %(error)s,
    -- Appended to the history in the same UPDATE, the last 20 kept (migration 0006).
    errors = jsonb_path_query_array(
        coalesce(job.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
            'attempt', job.attempts, 'failed_at', now(), 'worker_id', job.worker_id,
            'error', left(%(error)s, 2000))),
        '$[last - 19 to last]'),
    lease_token = NULL,
    lease_expires_at = NULL
WHERE job.id = %(id)s AND job.lease_token = %(token)s AND job.state = 'running'
RETURNING job.*;

-- name: job_reap
-- running -> queued or dead for leases that expired: the attempt counts as failed
-- and backs off like any other (delay = min(cap, base * 2^(attempt-1)), half of it
-- random, the same rule as pgqueue.backoff).
WITH expired AS (
    SELECT id,
           'lease expired after ' || to_char(now() - started_at, 'HH24:MI:SS.MS')
           || ' (worker ' || coalesce(worker_id, 'unknown') || ' stopped heartbeating)'
           AS error
    FROM {schema}.jobs
    WHERE state = 'running' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs AS job
SET state = CASE WHEN job.attempts >= job.max_attempts
                 THEN 'dead' ELSE 'queued' END::{schema}.job_state,
    run_at = CASE WHEN job.attempts >= job.max_attempts THEN job.run_at
                  ELSE now() + make_interval(secs =>
                      least(%(cap)s::float8,
                            %(base)s::float8 * power(2::float8, least(job.attempts - 1, 62)))
                      * (0.5 + random() / 2))
             END,
    finished_at = CASE WHEN job.attempts >= job.max_attempts THEN now() END,
    last_error = expired.error,
    -- As in job_fail.
    errors = jsonb_path_query_array(
        coalesce(job.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
            'attempt', job.attempts, 'failed_at', now(), 'worker_id', job.worker_id,
            'error', left(expired.error, 2000))),
        '$[last - 19 to last]'),
    lease_token = NULL,
    lease_expires_at = NULL
FROM expired
WHERE job.id = expired.id
RETURNING job.*;

-- name: job_cancel
-- queued | running -> cancelled. Clearing the lease token fences out a running worker.
UPDATE {schema}.jobs
SET state = 'cancelled', finished_at = now(), lease_token = NULL, lease_expires_at = NULL
WHERE id = %(id)s AND state IN ('queued', 'running')
RETURNING *;

-- name: job_retry
-- dead | cancelled -> queued, runnable now, with its attempts reset.
UPDATE {schema}.jobs
SET state = 'queued', run_at = now(), attempts = 0, finished_at = NULL, result = NULL,
    lease_token = NULL, lease_expires_at = NULL, worker_id = NULL
WHERE id = %(id)s AND state IN ('dead', 'cancelled')
RETURNING *;

-- name: job_get
SELECT * FROM {schema}.jobs WHERE id = %(id)s;

-- name: job_list
-- Newest first; %(after)s is the id of the last job of the previous page.
SELECT * FROM {schema}.jobs
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(state)s::text IS NULL OR state = %(state)s::{schema}.job_state)
  AND (%(task)s::text IS NULL OR task = %(task)s)
  AND (%(after)s::bigint IS NULL OR id < %(after)s)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: queue_stats
-- Counts per queue and state from the rollups (migration 0002), so the cost does not
-- grow with history, and the age of the oldest runnable job from the claim index.
-- One statement, so one snapshot.
WITH counts AS (
    SELECT queue,
           sum(queued)::bigint AS queued,
           sum(running)::bigint AS running,
           sum(succeeded)::bigint AS succeeded,
           sum(dead)::bigint AS dead,
           sum(cancelled)::bigint AS cancelled
    FROM {schema}.queue_rollups
    GROUP BY queue
)
SELECT counts.*,
       (SELECT extract(epoch FROM now() - min(job.run_at))::float8
        FROM {schema}.jobs AS job
        WHERE job.state = 'queued' AND job.queue = counts.queue AND job.run_at <= now())
           AS oldest_runnable_age_seconds
FROM counts
WHERE counts.queued + counts.running + counts.succeeded + counts.dead + counts.cancelled > 0
ORDER BY counts.queue;

-- name: jobs_unserved
-- Per queue and task, the queued jobs that have been runnable (and enqueued) for longer
-- than %(after_seconds)s while no job of that queue and task is running: jobs no worker
-- takes, most likely because no running worker serves their task in their queue (a
-- misspelt task name, a handler that was removed, a queue nobody serves), or because
-- the workers that do have been busy with other jobs all that time.
-- Cheap however much history the table holds, and bounded however long the backlog:
-- the queued jobs come from jobs_claim_idx (queued rows only), in claim order, at most
-- %(limit)s per queue (jobs nobody claims stay at the head of their queue, as claims go
-- past them), and the running ones from jobs_running_idx.
WITH waiting_queues AS (
    SELECT queue FROM {schema}.queue_rollups GROUP BY queue HAVING sum(queued) > 0
),
-- Read once, not once per queue.
running AS MATERIALIZED (
    SELECT DISTINCT queue, task FROM {schema}.jobs WHERE state = 'running'
),
waiting AS (
    SELECT waited.queue, waited.task
    FROM waiting_queues
    CROSS JOIN LATERAL (
        SELECT job.queue, job.task FROM {schema}.jobs AS job
        WHERE job.state = 'queued'
          AND job.queue = waiting_queues.queue
          AND job.run_at <= now() - make_interval(secs => %(after_seconds)s)
          -- Runnable since it was enqueued, for a job enqueued with a past run_at.
          AND job.enqueued_at <= now() - make_interval(secs => %(after_seconds)s)
        ORDER BY job.priority DESC, job.run_at, job.id
        LIMIT %(limit)s
    ) AS waited
)
SELECT queue, task, count(*)::bigint AS jobs
FROM waiting
WHERE NOT EXISTS (
    SELECT FROM running WHERE running.queue = waiting.queue AND running.task = waiting.task
)
GROUP BY queue, task
ORDER BY queue, task;

-- name: job_prune
-- Deletes one batch of finished jobs older than the cutoff; run until it deletes none.
DELETE FROM {schema}.jobs
WHERE id IN (
    SELECT id FROM {schema}.jobs
    WHERE state = ANY(%(states)s::{schema}.job_state[])
      AND finished_at < now() - make_interval(secs => %(older_than_seconds)s)
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
);

-- name: reaper_try_lock
-- Transaction-scoped, so it is safe behind PgBouncer; the reap runs in the same transaction.
-- A reaper paused inside this transaction (a frozen VM, SIGSTOP) would keep the lock, and
-- every other worker from reaping, until it resumed: the server ends such a session once
-- it has sat idle in the transaction for 5 s (for this transaction only).
SELECT pg_try_advisory_xact_lock(%(key)s) AS locked,
       set_config('idle_in_transaction_session_timeout', '5s', true) AS idle_limit;

-- name: migration_lock
SELECT pg_advisory_xact_lock(%(key)s);

-- name: migration_table_create
CREATE TABLE IF NOT EXISTS {schema}.migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migration_applied
SELECT version FROM {schema}.migrations ORDER BY version;

-- name: migration_record
INSERT INTO {schema}.migrations (version, name) VALUES (%(version)s, %(name)s);

-- name: database_now
SELECT now() AS now;

-- name: queue_metrics_snapshot
-- Every queue's gauges, counters and start-latency histogram, from the rollups that
-- migration 0002's triggers keep, in one statement so they all come from one snapshot.
-- start_counts holds one count per bound of start_bounds, in order, not cumulative.
WITH totals AS (
    SELECT queue,
           sum(queued)::bigint AS queued,
           sum(running)::bigint AS running,
           sum(succeeded)::bigint AS succeeded,
           sum(dead)::bigint AS dead,
           sum(cancelled)::bigint AS cancelled,
           sum(completed)::bigint AS completed,
           sum(failures)::bigint AS failures
    FROM {schema}.queue_rollups
    GROUP BY queue
),
latency AS (
    SELECT queue, le, sum(starts)::bigint AS starts, sum(seconds_sum) AS seconds_sum
    FROM {schema}.start_latency_buckets
    GROUP BY queue, le
)
SELECT totals.*,
       histogram.start_counts,
       histogram.start_seconds_sum,
       {schema}.start_latency_bounds() AS start_bounds
FROM totals
CROSS JOIN LATERAL (
    SELECT array_agg(coalesce(latency.starts, 0) ORDER BY bound.position) AS start_counts,
           coalesce(sum(latency.seconds_sum), 0)::float8 AS start_seconds_sum
    FROM unnest({schema}.start_latency_bounds()) WITH ORDINALITY AS bound (le, position)
    LEFT JOIN latency ON latency.queue = totals.queue AND latency.le = bound.le
) AS histogram
ORDER BY totals.queue;

-- name: database_ping
-- The health check: the server answers a query.
SELECT 1 AS ok;

-- name: job_next_run_delay
-- Seconds until the next job this worker could claim becomes runnable (zero or less:
-- one is runnable now), on the database clock, so a worker sleeps exactly until then.
SELECT extract(epoch FROM min(run_at) - now())::float8 AS seconds FROM {schema}.jobs
WHERE state = 'queued'
  AND queue = ANY(%(queues)s::text[])
  AND task = ANY(%(tasks)s::text[]);

-- name: jobs_listen
-- Subscribes the session to the channel the insert and requeue triggers notify.
LISTEN {channel};

-- name: pruner_try_lock
-- The automatic pruner's turn: transaction-scoped, like the reaper's, so it is safe
-- behind PgBouncer; one batch of job_prune runs in the same transaction, so however many
-- workers run a pruner, one deletes at a time.
SELECT pg_try_advisory_xact_lock(%(key)s) AS locked;
