-- Outcomes: what became of each attempt (acks, failures, throttles), heartbeats, fences,
-- handlers' own completions, progress, and the reaper.
-- Placeholders and parameters: see pgqueue/queries.py.

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
    -- FOR NO KEY UPDATE, the lock the UPDATE below takes anyway: it skips the rows an
    -- ack, a failure, a cancel or the reaper holds, but not a job a handler's
    -- transaction holds by job_fence (FOR KEY SHARE), whose lease must go on being
    -- extended for as long as that transaction keeps the reaper from it.
    SELECT job.id FROM {schema}.active_jobs AS job JOIN lease USING (id)
    WHERE job.lease_token = lease.token AND job.state = 'running'
    FOR NO KEY UPDATE OF job SKIP LOCKED
),
extended AS (
    UPDATE {schema}.active_jobs AS job
    SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
    FROM held
    WHERE job.id = held.id
    RETURNING job.id
),
seen AS (
    -- With a %(worker_id)s (pgqueue worker), the worker's row in the registry is renewed
    -- by the beat it sends anyway, and written again if it was lost (expired during an
    -- outage, or an unlogged table emptied by a crash).
    INSERT INTO {schema}.workers AS worker
        (id, host, pid, version, queues, tasks, concurrency, started_at, last_seen_at,
         expires_at)
    SELECT %(worker_id)s, %(worker_host)s, %(worker_pid)s, %(worker_version)s,
           %(worker_queues)s::text[], %(worker_tasks)s::text[], %(worker_concurrency)s,
           %(worker_started_at)s, now(), now() + make_interval(secs => %(worker_seconds)s)
    WHERE %(worker_id)s::text IS NOT NULL
    ON CONFLICT (id) DO UPDATE
    SET last_seen_at = excluded.last_seen_at, expires_at = excluded.expires_at
),
kept AS (
    -- The first worker to beat after the registry was lost (see workers_kept_since)
    -- says since when it is kept again; every other beat only reads that it is.
    INSERT INTO {schema}.workers_kept_since AS kept (since, server_started)
    SELECT now(), pg_postmaster_start_time()
    WHERE %(worker_id)s::text IS NOT NULL
      AND NOT EXISTS (SELECT FROM {schema}.workers_kept_since
                      WHERE server_started = pg_postmaster_start_time())
    ON CONFLICT (one) DO UPDATE
    SET since = excluded.since, server_started = excluded.server_started
)
-- Lost: neither extended nor, as this statement's snapshot saw it, still ours and
-- merely locked by someone else.
SELECT lease.id FROM lease
WHERE NOT EXISTS (SELECT FROM extended WHERE extended.id = lease.id)
  AND NOT EXISTS (
      SELECT FROM {schema}.active_jobs AS job
      WHERE job.id = lease.id AND job.lease_token = lease.token AND job.state = 'running'
  );

-- name: job_finish_many
-- What became of a batch of attempts, for the leases still held, in one statement:
-- running -> succeeded for each result, and for each error running -> queued after the
-- delay given, or -> dead once the job's attempts are used up. Finished jobs move from
-- active_jobs to finished_jobs, and the queues' counters and the run-time histogram
-- grow. The delays come from pgqueue.backoff, the one place they are worked out, and
-- the reaper finishes expired leases through this statement too.
--
-- Returns one row per failed attempt written (its position in the arrays, counted
-- from 1, and what it left: state, run_at, errors, has_dependents), or a single row of
-- NULLs in those columns when there was none. Every row also carries the statement's
-- time (every job it finished shares it), the positions of the outcomes refused
-- because their lease was no longer held, and how many waiting jobs it released.
-- Nothing else per job comes back: the worker already holds the rest of each row. One
-- batch may carry two outcomes of the same job (a stale attempt's and the one that
-- re-claimed it after a cancel and retry, or a reap); only the holder of the current
-- token is written.
--
-- Its time (finished_at, and failed_at in the error history) is now(), the start of its
-- transaction, shared by every statement of a batch too large for one: it opens its
-- transaction (a worker's, or the one it shares with the next claim, where it comes
-- first), and that transaction begins after the claims of the leases it finishes
-- committed; the reaper's begins after those leases expired. So it never precedes an
-- attempt's start, and a job it releases is claimed later (see claim_clock).
WITH outcome AS (
    -- The outcomes arrive as texts zipped back into rows here: a worker sends
    -- thousands a second, and a few strings cost the client a fraction of arrays dumped
    -- element by element. A batch of successes only sends NULL errors and delays,
    -- which ROWS FROM pads out with NULLs.
    SELECT id, token, result, error, delay, position
    FROM ROWS FROM (
        unnest(%(ids)s::bigint[]),
        unnest(%(tokens)s::uuid[]),
        jsonb_array_elements(%(results)s::jsonb),
        jsonb_array_elements_text(%(errors)s::jsonb),
        unnest(%(delays)s::float8[])
    ) WITH ORDINALITY AS outcome (id, token, result, error, delay, position)
),
retried AS (
    UPDATE {schema}.active_jobs AS job
    SET state = 'queued',
        run_at = now() + make_interval(secs => outcome.delay),
        last_error = outcome.error,
        errors = {schema}.errors_appended(job.errors, job.attempts, job.worker_id, outcome.error),
        lease_token = NULL,
        lease_expires_at = NULL
    FROM outcome
    WHERE job.id = outcome.id AND job.lease_token = outcome.token AND job.state = 'running'
      AND outcome.error IS NOT NULL AND job.attempts < job.max_attempts
    RETURNING job.queue, job.run_at, job.errors, job.has_dependents, outcome.position
),
ended AS (
    DELETE FROM {schema}.active_jobs AS job
    USING outcome
    WHERE job.id = outcome.id AND job.lease_token = outcome.token AND job.state = 'running'
      AND (outcome.error IS NULL OR job.attempts >= job.max_attempts)
    RETURNING job.*, outcome.result AS outcome, outcome.error AS failure, outcome.position,
              CASE WHEN outcome.error IS NOT NULL
                   THEN {schema}.errors_appended(job.errors, job.attempts, job.worker_id,
                                                 outcome.error)
              END AS errors_now
),
moved AS (
    -- A success keeps the errors of earlier attempts in errors, and leaves last_error
    -- NULL: it is for jobs that have not succeeded.
    INSERT INTO {schema}.finished_jobs
        (id, queue, task, payload, priority, state, run_at, attempts, max_attempts,
         timeout_seconds, worker_id, enqueued_at, started_at, finished_at, last_error,
         result, idempotency_key, errors, trace_context, unique_key, has_dependents,
         tags, progress, partition_key)
    SELECT id, queue, task, payload, priority,
           (CASE WHEN failure IS NULL THEN 'succeeded' ELSE 'dead' END)::{schema}.job_state,
           run_at, attempts,
           max_attempts, timeout_seconds, worker_id, enqueued_at, started_at, now(), failure,
           CASE WHEN failure IS NULL THEN outcome ELSE result END, idempotency_key,
           coalesce(errors_now, errors), trace_context, unique_key, has_dependents,
           tags, progress, partition_key
    FROM ended
),
run AS (
    -- The acked attempts per queue, task and claim: the jobs of one claim share their
    -- started_at, and the statement's now() is one value, so the run time is worked out
    -- once per claim, not once per job, and the counters and the histogram below both
    -- add up these few rows.
    SELECT queue, task, count(*) AS attempts,
           greatest(0, date_part('epoch', now() - coalesce(started_at, now()))) AS seconds
    FROM ended
    WHERE failure IS NULL
    GROUP BY queue, task, started_at
),
timed AS (
    -- The run-time histogram (see run_time_buckets): per queue, task and bucket, the
    -- attempts acked and their seconds. An attempt falls in the bucket of the smallest
    -- bound at or above its run time: width_bucket() gives the largest bound at or
    -- below it, and the next one unless the run time equals that bound.
    INSERT INTO {schema}.run_time_buckets AS bucket (queue, task, le, slot, attempts, seconds)
    SELECT queue, task, le[position + (position = 0 OR seconds > le[position])::int],
           {schema}.counter_slot(), sum(attempts), sum(seconds * attempts)
    FROM (
        SELECT queue, task, attempts, seconds, le, width_bucket(seconds, le) AS position
        FROM run, (SELECT {schema}.run_time_bounds() AS le) AS bounds
    ) AS placed
    GROUP BY 1, 2, 3
    ORDER BY 1, 2, 3
    ON CONFLICT (queue, task, le, slot) DO UPDATE
    SET attempts = bucket.attempts + excluded.attempts,
        seconds = bucket.seconds + excluded.seconds
),
begun AS (
    -- The pickup wait of each failed attempt that goes back to queued, read before
    -- retried moves its run_at on (this is the statement's snapshot; the token check
    -- makes it the same attempt that retried writes). Only failures: the rare case.
    SELECT outcome.position, job.queue,
           {schema}.pickup_seconds(job.started_at, job.enqueued_at, job.run_at) AS seconds
    FROM outcome
    JOIN {schema}.active_jobs AS job ON job.id = outcome.id
    WHERE outcome.error IS NOT NULL AND job.lease_token = outcome.token
      AND job.state = 'running'
),
picked_up AS (
    -- The pickup histogram (see pickup_buckets): every attempt this statement ended,
    -- once, in the bucket of the smallest bound at or above its wait (as in timed).
    INSERT INTO {schema}.pickup_buckets AS bucket (queue, le, slot, attempts, seconds)
    SELECT queue, le[position + (position = 0 OR seconds > le[position])::int],
           {schema}.counter_slot(), count(*), sum(seconds)
    FROM (
        SELECT queue, seconds, le, width_bucket(seconds, le) AS position
        FROM (
            SELECT queue, {schema}.pickup_seconds(started_at, enqueued_at, run_at) AS seconds
            FROM ended
            UNION ALL
            SELECT begun.queue, begun.seconds FROM begun JOIN retried USING (position)
        ) AS waited,
        (SELECT {schema}.pickup_bounds() AS le) AS bounds
    ) AS placed
    GROUP BY 1, 2, 3
    ORDER BY 1, 2, 3
    ON CONFLICT (queue, le, slot) DO UPDATE
    SET attempts = bucket.attempts + excluded.attempts,
        seconds = bucket.seconds + excluded.seconds
),
failed AS (
    SELECT position, 'queued' AS state, run_at, errors, has_dependents, queue FROM retried
    UNION ALL
    SELECT position, 'dead', run_at, errors_now, has_dependents, queue
    FROM ended WHERE failure IS NOT NULL
),
counted AS (
    INSERT INTO {schema}.queue_counters AS counter
        (queue, slot, succeeded, completed, dead, failures)
    SELECT queue, {schema}.counter_slot(), sum(succeeded), sum(succeeded), sum(dead),
           sum(failures)
    FROM (
        SELECT queue, attempts AS succeeded, 0 AS dead, 0 AS failures FROM run
        UNION ALL
        SELECT queue, 0, (state = 'dead')::int, 1 FROM failed
    ) AS counts
    GROUP BY queue ORDER BY queue
    ON CONFLICT (queue, slot) DO UPDATE
    SET succeeded = counter.succeeded + excluded.succeeded,
        completed = counter.completed + excluded.completed,
        dead = counter.dead + excluded.dead,
        failures = counter.failures + excluded.failures
),
watched AS (
    -- The jobs this statement finished that someone waits for (see job_waiters in
    -- schema.sql), each announced by id on the done channel as the transaction
    -- commits. Nobody waits, nearly always: the first EXISTS, run once, finds the table
    -- empty, and no job of the batch is looked up. Read once, by the final SELECT.
    SELECT pg_notify({done_channel_name}, ended.id::text)
    FROM ended
    WHERE EXISTS (SELECT FROM {schema}.job_waiters)
      AND EXISTS (SELECT FROM {schema}.job_waiters AS waiter WHERE waiter.job_id = ended.id)
),
written AS (
    SELECT now() AS written_at,
           ARRAY(
               SELECT position FROM outcome
               WHERE position NOT IN (SELECT position FROM ended
                                      UNION ALL SELECT position FROM retried)
               ORDER BY position
           ) AS refused,
           -- The waiting jobs whose last dependency this statement acked become queued
           -- (see dependents_released). Only when an acked job has dependents, the rare
           -- case: has_dependents is read from the row this statement deleted, which is
           -- the latest version, so an enqueue naming one of these jobs as a dependency
           -- either committed before (this statement waited for its row lock) or will
           -- find the job succeeded. The function's own statement takes a new snapshot,
           -- taken after those waits: it sees the dependency rows of the enqueues waited
           -- for. The dependents of dead jobs are cancelled by the caller, in a
           -- statement of their own in the same transaction (see job_dependents_cancel).
           CASE WHEN EXISTS (SELECT FROM ended WHERE failure IS NULL AND has_dependents)
                THEN {schema}.dependents_released(
                         ARRAY(SELECT id FROM ended WHERE failure IS NULL AND has_dependents),
                         {channel_name})
                ELSE 0
           END AS released
)
SELECT written.written_at, written.refused, written.released,
       failed.position, failed.state, failed.run_at, failed.errors, failed.has_dependents
FROM written LEFT JOIN failed ON true
WHERE (SELECT count(*) FROM watched) >= 0
ORDER BY failed.position;

-- name: job_fence
-- Job.fence: holds a running attempt in the caller's transaction, if its lease is still
-- this one's. FOR KEY SHARE conflicts only with FOR UPDATE: the reaper
-- (job_expired_lock, SKIP LOCKED) passes the job by, and a cancel, an ack or a failure
-- of it (each deletes the row or changes its lease token) waits, until the caller's
-- transaction ends; the heartbeat's UPDATE (FOR NO KEY UPDATE) does not wait, so the
-- lease goes on being extended meanwhile. No row: the lease is gone, and the caller
-- fails its transaction (lease_lost_raise).
SELECT id FROM {schema}.active_jobs
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running'
FOR KEY SHARE;

-- name: job_completion_evidence
-- Job.complete, after job_finish_many in the same transaction: what later tells
-- whether that completion committed (job_completions_check). xact is the top-level
-- transaction; row_xmin the (sub)transaction that wrote the finished row, which differs
-- from it inside a savepoint, whose rollback undoes the completion alone.
SELECT pg_current_xact_id()::text AS xact,
       (SELECT xmin::text FROM {schema}.finished_jobs
        WHERE id = %(id)s AND state = 'succeeded') AS row_xmin;

-- name: job_completions_check
-- Whether the completions Job.complete recorded have committed, one row per
-- completion: whether the finished row it wrote is there (found) for every transaction
-- to see, which only the commit of its (sub)transaction makes so, and the status of
-- its transaction, which tells one still open from one rolled back. The status alone
-- is not taken for a commit: after a crash or a failover, a transaction id that never
-- reached the WAL is given out again, to another transaction (one past the next id to
-- be given out, pg_xact_status would refuse: it was lost in the crash, so NULL; this
-- statement's own id, given out now, is the bound).
SELECT completion.position,
       CASE WHEN completion.xact::xid8 < pg_current_xact_id()
            THEN pg_xact_status(completion.xact::xid8)
       END AS status,
       coalesce(finished.xmin::text = completion.row_xmin, false) AS found,
       finished.finished_at
FROM unnest(%(ids)s::bigint[], %(xacts)s::text[], %(row_xmins)s::text[])
     WITH ORDINALITY AS completion (id, xact, row_xmin, position)
LEFT JOIN {schema}.finished_jobs AS finished
       ON finished.id = completion.id AND finished.state = 'succeeded'
ORDER BY completion.position;

-- name: lease_lost_raise
-- Fails the caller's transaction when Job.complete or Job.fence finds the lease gone:
-- an error of PostgreSQL's own, so that no part of the transaction can commit, even if
-- the caller catches the LeaseLost raised from it. {message} is a literal.
DO $pgqueue$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'PQ001',
        MESSAGE = {message},
        HINT = 'Roll the transaction back: this attempt of the job is over, and another '
               'attempt (or none, if it was cancelled) does its work.';
END
$pgqueue$;

-- name: job_expired_lock
-- The running jobs whose lease expired (their worker stopped heartbeating), oldest
-- expiry first, locked for the reaper to finish as failed attempts through
-- job_finish_many in the same transaction. ran_for is how long each attempt had run.
SELECT job.*, now() - job.started_at AS ran_for
FROM {schema}.active_jobs AS job
WHERE state = 'running' AND lease_expires_at < now()
ORDER BY lease_expires_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: reaper_try_lock
-- Transaction-scoped, so it is safe behind PgBouncer; the reap runs in the same transaction.
-- A reaper paused inside this transaction (a frozen VM, SIGSTOP) would keep the lock, and
-- every other worker from reaping, until it resumed: the server ends such a session once
-- it has sat idle in the transaction for 5 s (for this transaction only).
SELECT pg_try_advisory_xact_lock(%(key)s) AS locked,
       set_config('idle_in_transaction_session_timeout', '5s', true) AS idle_limit;

-- name: job_throttle_many
-- Handlers that raised Throttle: each running job whose lease is still held goes back
-- to queued, runnable after its delay, and gives its attempt back (the claim counted
-- it: attempts goes down by one, so throttles never bring a job closer to dead). A
-- "partition" scope also throttles the job's key of its queue, a "queue" scope the
-- whole queue, until the same time (a later end wins over an earlier one, never the
-- other way). Returns the ids written; a lease lost meanwhile writes nothing.
WITH throttle AS (
    SELECT id, token, delay, scope
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(delays)s::float8[],
                %(scopes)s::text[]) AS throttle (id, token, delay, scope)
),
requeued AS (
    UPDATE {schema}.active_jobs AS job
    SET state = 'queued',
        run_at = now() + make_interval(secs => throttle.delay),
        attempts = greatest(job.attempts - 1, 0),
        lease_token = NULL,
        lease_expires_at = NULL
    FROM throttle
    WHERE job.id = throttle.id AND job.lease_token = throttle.token
      AND job.state = 'running'
    RETURNING job.id, job.queue, job.partition_key, job.run_at, throttle.scope
),
queues_throttled AS (
    INSERT INTO {schema}.queue_settings AS setting (queue, throttled_until)
    SELECT queue, max(run_at) FROM requeued
    WHERE scope = 'queue'
    GROUP BY queue
    ORDER BY queue
    ON CONFLICT (queue) DO UPDATE
    SET throttled_until = greatest(setting.throttled_until, excluded.throttled_until)
    RETURNING setting.queue
),
keys_throttled AS (
    -- After the queues' rows (it reads what queues_throttled wrote): a claim of a
    -- limited queue locks the queue's row, then writes its keys' rows, and rows taken
    -- in the same order never wait for each other in a cycle.
    INSERT INTO {schema}.partition_controls AS control
        (queue, partition_key, throttled_until)
    SELECT queue, partition_key, max(run_at) FROM requeued
    WHERE scope = 'partition' AND partition_key IS NOT NULL
      AND (SELECT count(*) FROM queues_throttled) >= 0
    GROUP BY queue, partition_key
    ORDER BY queue, partition_key
    ON CONFLICT (queue, partition_key) DO UPDATE
    SET throttled_until = greatest(control.throttled_until, excluded.throttled_until)
    RETURNING control.queue
)
SELECT id FROM requeued WHERE (SELECT count(*) FROM keys_throttled) >= 0;

-- name: job_progress_write
-- The latest progress that running handlers reported (Job.progress), for the leases
-- given, fenced as an outcome is: a lease that was lost (reaped, cancelled) writes
-- nothing. As a heartbeat does, it never waits for a row lock: a row another
-- transaction holds is being finished or beaten right now, and the worker writes its
-- progress again on its next round, so the two never wait for each other in a cycle.
-- Returns the ids written. Touches no indexed column: a HOT update.
WITH reported AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(fractions)s::float8[],
                         %(messages)s::text[]) AS reported (id, token, fraction, message)
),
held AS (
    SELECT job.id, reported.fraction, reported.message
    FROM {schema}.active_jobs AS job JOIN reported USING (id)
    WHERE job.lease_token = reported.token AND job.state = 'running'
    FOR NO KEY UPDATE OF job SKIP LOCKED
)
UPDATE {schema}.active_jobs AS job
SET progress = jsonb_build_object('fraction', held.fraction, 'message', held.message,
                                  'at', now())
FROM held
WHERE job.id = held.id
RETURNING job.id;
