-- Version 12: flow control. Jobs carry a partition key (a tenant, a customer, an
-- account); claims share a queue fairly between its keys; a queue may limit how many
-- jobs of one key run at once and start per second; handlers and operators may
-- throttle a key or a whole queue for a while.
--
-- The new columns are nullable, without defaults, so adding them rewrites nothing and
-- takes only a brief ACCESS EXCLUSIVE lock on each table. The claim index is built
-- again for the jobs without a key only (those with one get an index of their own):
-- a plain CREATE INDEX inside this migration's transaction, which blocks enqueues,
-- claims and acks for as long as the build takes, which grows with the backlog (see
-- 0011 for building indexes beforehand with CREATE INDEX CONCURRENTLY under the same
-- names and definitions; this migration then leaves the two on jobs with a key be).
--
-- Workers of an earlier version keep working, more slowly and without flow control:
-- their claim statements do not say "partition_key IS NULL", so they cannot use the
-- new claim index and read the queued jobs without it, and they take jobs with a key in
-- enqueue order, past the partition limits. Upgrade the workers right after the schema.
-- The statements with which they move a job between the tables carry only the columns
-- they know, so a job they finish loses its partition key (none had one unless a newer
-- producer enqueued it). See ../schema.sql for what each part is for.

ALTER TABLE {schema}.active_jobs ADD COLUMN IF NOT EXISTS partition_key text;
ALTER TABLE {schema}.finished_jobs ADD COLUMN IF NOT EXISTS partition_key text;

-- The view's columns were fixed when it was made: make it again, with the new one.
CREATE OR REPLACE VIEW {schema}.jobs AS
    SELECT * FROM {schema}.active_jobs
    UNION ALL
    SELECT * FROM {schema}.finished_jobs;

DROP INDEX IF EXISTS {schema}.active_jobs_claim_idx;
CREATE INDEX active_jobs_claim_idx
    ON {schema}.active_jobs (queue, task, priority DESC, run_at, id)
    WHERE state = 'queued' AND partition_key IS NULL;

CREATE INDEX IF NOT EXISTS active_jobs_partition_claim_idx
    ON {schema}.active_jobs (queue, task, priority DESC, partition_key, run_at, id)
    WHERE state = 'queued' AND partition_key IS NOT NULL;

CREATE INDEX IF NOT EXISTS active_jobs_partition_running_idx
    ON {schema}.active_jobs (queue, partition_key)
    WHERE state = 'running' AND partition_key IS NOT NULL;

ALTER TABLE {schema}.queue_settings
    ADD COLUMN partition_concurrency_limit integer
        CHECK (partition_concurrency_limit >= 0),
    ADD COLUMN partition_rate_limit double precision
        CHECK (partition_rate_limit > 0
               AND partition_rate_limit < 'Infinity'::double precision),
    ADD COLUMN throttled_until timestamptz;

CREATE TABLE {schema}.partition_controls (
    queue           text NOT NULL,
    partition_key   text NOT NULL,
    tokens          double precision,
    tokens_at       timestamptz,
    throttled_until timestamptz,
    PRIMARY KEY (queue, partition_key)
);

CREATE UNLOGGED TABLE {schema}.fair_share_cursors (
    queue         text PRIMARY KEY,
    partition_key text NOT NULL
);

CREATE FUNCTION {schema}.lane_after(
    queue text, task text, turn text, priority smallint, partition_key text,
    wrapped boolean)
RETURNS TABLE (lane_priority smallint, lane_key text, lane_wrapped boolean,
              lane_run_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT found.priority, found.partition_key, found.wrapped, found.run_at
    FROM (
        (SELECT job.priority, job.partition_key, lane_after.wrapped, job.run_at
         FROM {schema}.active_jobs AS job
         WHERE job.state = 'queued' AND job.partition_key IS NOT NULL
           AND job.queue = lane_after.queue AND job.task = lane_after.task
           AND job.priority = lane_after.priority
           AND job.partition_key > lane_after.partition_key
           AND (NOT lane_after.wrapped OR job.partition_key <= lane_after.turn)
         ORDER BY job.partition_key, job.run_at, job.id
         LIMIT 1)
        UNION ALL
        (SELECT job.priority, job.partition_key, true, job.run_at
         FROM {schema}.active_jobs AS job
         WHERE job.state = 'queued' AND job.partition_key IS NOT NULL
           AND job.queue = lane_after.queue AND job.task = lane_after.task
           AND job.priority = lane_after.priority
           AND NOT lane_after.wrapped AND job.partition_key <= lane_after.turn
         ORDER BY job.partition_key, job.run_at, job.id
         LIMIT 1)
        UNION ALL
        (SELECT lower.priority, first.partition_key, first.wrapped, first.run_at
         FROM (
             SELECT job.priority
             FROM {schema}.active_jobs AS job
             WHERE job.state = 'queued' AND job.partition_key IS NOT NULL
               AND job.queue = lane_after.queue AND job.task = lane_after.task
               AND (lane_after.priority IS NULL OR job.priority < lane_after.priority)
             ORDER BY job.priority DESC
             LIMIT 1
         ) AS lower
         CROSS JOIN LATERAL (
             SELECT starting.partition_key, starting.wrapped, starting.run_at
             FROM (
                 (SELECT job.partition_key, false AS wrapped, job.run_at
                  FROM {schema}.active_jobs AS job
                  WHERE job.state = 'queued' AND job.partition_key IS NOT NULL
                    AND job.queue = lane_after.queue AND job.task = lane_after.task
                    AND job.priority = lower.priority
                    AND job.partition_key > coalesce(lane_after.turn, '')
                  ORDER BY job.partition_key, job.run_at, job.id
                  LIMIT 1)
                 UNION ALL
                 (SELECT job.partition_key, true, job.run_at
                  FROM {schema}.active_jobs AS job
                  WHERE job.state = 'queued' AND job.partition_key IS NOT NULL
                    AND job.queue = lane_after.queue AND job.task = lane_after.task
                    AND job.priority = lower.priority
                    AND job.partition_key <= lane_after.turn
                  ORDER BY job.partition_key, job.run_at, job.id
                  LIMIT 1)
             ) AS starting
             LIMIT 1
         ) AS first)
    ) AS found
    LIMIT 1
$$;

CREATE FUNCTION {schema}.partition_room(
    queue text, partition_key text, concurrency_limit integer,
    rate_limit double precision, wanted integer,
    OUT room integer, OUT tokens double precision)
LANGUAGE sql VOLATILE AS $$
    SELECT CASE
               WHEN control.throttled_until > clock_timestamp() THEN 0
               ELSE least(
                   wanted,
                   CASE WHEN concurrency_limit IS NOT NULL THEN greatest(0,
                       concurrency_limit - (
                           SELECT count(*) FROM {schema}.active_jobs AS job
                           WHERE job.state = 'running' AND job.queue = $1
                             AND job.partition_key = $2))::int
                   END,
                   floor(bucket.tokens)::int)
           END,
           bucket.tokens
    FROM (SELECT) AS one
    LEFT JOIN {schema}.partition_controls AS control
           ON control.queue = $1 AND control.partition_key = $2
    LEFT JOIN LATERAL (
        SELECT least(greatest(1, rate_limit / 10),
                     coalesce(control.tokens, greatest(1, rate_limit / 10))
                     + rate_limit * greatest(0, extract(epoch FROM
                         clock_timestamp() - coalesce(control.tokens_at, clock_timestamp()))))
                   AS tokens
        WHERE rate_limit IS NOT NULL
    ) AS bucket ON true
$$;

-- A waiting job cancelled because a dependency failed keeps its partition key.
CREATE OR REPLACE FUNCTION {schema}.dependents_checked(channel text, fired_by bigint DEFAULT NULL)
RETURNS TABLE (job_id bigint, state text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    checking bigint[];
    ended bigint;
BEGIN
    IF fired_by IS NOT NULL AND NOT EXISTS (
        SELECT FROM {schema}.dependents_to_check AS unchecked
        WHERE unchecked.job_id = fired_by
    ) THEN
        RETURN;
    END IF;
    WITH taken AS (
        DELETE FROM {schema}.dependents_to_check AS unchecked RETURNING unchecked.job_id
    )
    SELECT array_agg(taken.job_id) INTO checking FROM taken;
    IF checking IS NULL THEN
        RETURN;
    END IF;

    UPDATE {schema}.active_jobs AS dependency
    SET has_dependents = true
    WHERE dependency.id = ANY(ARRAY(
        SELECT job.id FROM {schema}.active_jobs AS job
        WHERE job.id IN (SELECT link.depends_on FROM {schema}.job_dependencies AS link
                         WHERE link.job_id = ANY(checking))
        ORDER BY job.id
        FOR NO KEY UPDATE OF job
    ))
      AND NOT dependency.has_dependents;

    LOOP
        RETURN QUERY
        WITH doomed AS (
            SELECT DISTINCT ON (link.job_id)
                   link.job_id,
                   'dependency ' || link.depends_on || ' ended ' || failed.state AS reason
            FROM {schema}.job_dependencies AS link
            JOIN {schema}.finished_jobs AS failed ON failed.id = link.depends_on
            WHERE link.job_id = ANY(checking) AND failed.state IN ('dead', 'cancelled')
              AND NOT link.finished_mode
            ORDER BY link.job_id, link.depends_on
        ),
        cancelled AS (
            DELETE FROM {schema}.active_jobs AS job
            USING doomed
            WHERE job.id = doomed.job_id AND job.state = 'waiting'
            RETURNING job.*, doomed.reason
        ),
        moved AS (
            INSERT INTO {schema}.finished_jobs
                (id, queue, task, payload, priority, state, run_at, attempts, max_attempts,
                 timeout_seconds, worker_id, enqueued_at, started_at, finished_at,
                 last_error, result, idempotency_key, errors, trace_context, unique_key,
                 pending_dependencies, has_dependents,
                 tags, progress, partition_key)
            SELECT cancelled.id, cancelled.queue, cancelled.task, cancelled.payload,
                   cancelled.priority, 'cancelled', cancelled.run_at, cancelled.attempts,
                   cancelled.max_attempts, cancelled.timeout_seconds, cancelled.worker_id,
                   cancelled.enqueued_at, cancelled.started_at, clock_timestamp(),
                   cancelled.reason, cancelled.result, cancelled.idempotency_key,
                   cancelled.errors, cancelled.trace_context, cancelled.unique_key,
                   cancelled.pending_dependencies, cancelled.has_dependents,
                   cancelled.tags, cancelled.progress, cancelled.partition_key
            FROM cancelled
            RETURNING finished_jobs.id
        ),
        counted AS (
            INSERT INTO {schema}.queue_counters AS counter (queue, slot, cancelled)
            SELECT cancelled.queue, {schema}.counter_slot(), count(*) FROM cancelled
            GROUP BY cancelled.queue ORDER BY cancelled.queue
            ON CONFLICT (queue, slot)
            DO UPDATE SET cancelled = counter.cancelled + excluded.cancelled
        ),
        watched AS (
            -- The cancelled jobs that someone waits for (see job_waiters), announced by
            -- id on the done channel, as job_finish_many announces those it finishes.
            SELECT pg_notify(channel || '_done', moved.id::text)
            FROM moved
            WHERE EXISTS (SELECT FROM {schema}.job_waiters)
              AND EXISTS (SELECT FROM {schema}.job_waiters AS waiter
                          WHERE waiter.job_id = moved.id)
        )
        SELECT moved.id, 'cancelled'::text FROM moved
        WHERE (SELECT count(*) FROM watched) >= 0;
        GET DIAGNOSTICS ended = ROW_COUNT;
        EXIT WHEN ended = 0;
    END LOOP;

    RETURN QUERY
    WITH unmet AS (
        SELECT link.job_id, count(dependency.id)::integer AS jobs
        FROM {schema}.job_dependencies AS link
        LEFT JOIN {schema}.active_jobs AS dependency ON dependency.id = link.depends_on
        WHERE link.job_id = ANY(checking)
        GROUP BY link.job_id
    ),
    counted AS (
        UPDATE {schema}.active_jobs AS job
        SET pending_dependencies = unmet.jobs,
            state = (CASE WHEN unmet.jobs > 0 THEN 'waiting' ELSE 'queued' END)::{schema}.job_state
        FROM unmet
        WHERE job.id = unmet.job_id AND job.state = 'waiting'
          AND (job.pending_dependencies IS DISTINCT FROM unmet.jobs OR unmet.jobs = 0)
        RETURNING job.id, job.queue, job.state
    ),
    woken AS (
        SELECT pg_notify(channel, wanted.queue)
        FROM (SELECT DISTINCT counted.queue FROM counted WHERE counted.state = 'queued')
             AS wanted
        WHERE EXISTS (
            SELECT FROM {schema}.queue_waiters AS waiter
            WHERE waiter.queue = wanted.queue AND waiter.expires_at > now()
        )
    )
    SELECT counted.id, counted.state::text FROM counted
    WHERE (SELECT count(*) FROM woken) >= 0;
END
$$;
