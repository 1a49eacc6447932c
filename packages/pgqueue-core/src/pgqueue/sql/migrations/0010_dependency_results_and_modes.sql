-- Version 10: results along dependencies, and a dependency mode.
--
-- job_dependencies keeps where depends_on named each dependency (position), for a job's
-- job.dependencies to come in that order, and the dependent's dependency_mode
-- (finished_mode): a dependent in 'finished' mode waits for its dependencies to be
-- final in any state, and is never cancelled by one that ended dead or cancelled.
-- Both columns are added without a rewrite or a scan (a constant default); the links
-- written before keep NULL positions (they come after, by id) and 'succeeded' mode,
-- which is what they were enqueued with. dependents_checked leaves a finished-mode
-- dependent to be counted rather than cancelled; the rest of it is as version 9 left
-- it. The statements that cancel dependents on a death or a cancel are pgqueue's
-- own (../queries.sql): a worker of an earlier version still cancels a finished-mode
-- dependent whose dependency it saw die, so enqueue in 'finished' mode once every
-- worker runs this version. See ../schema.sql for what each part is for.

ALTER TABLE {schema}.job_dependencies
    ADD COLUMN position integer,
    ADD COLUMN finished_mode boolean NOT NULL DEFAULT false;

-- Dependents in 'finished' mode counted again, by the statements of a producer's cancel
-- and retry (job_dependents_cancel, job_retry), which may not change jobs' states
-- themselves (see ../roles.py): this runs as the schema's owner. Each of job_ids still
-- waiting adds changes[i] to its pending dependencies: a dependency that ended dead or
-- cancelled counts off (-1 each), one retried is waited for again (+1); one left with
-- none is queued. Those changed come back. A row update, as in dependents_released: an
-- ack and a death of a job's last two dependencies take turns on its row, and exactly
-- one of them queues it.
CREATE FUNCTION {schema}.finished_dependents_recounted(job_ids bigint[], changes integer[])
RETURNS SETOF {schema}.active_jobs
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    UPDATE {schema}.active_jobs AS job
    SET pending_dependencies = job.pending_dependencies + counted.change,
        state = CASE WHEN job.pending_dependencies + counted.change <= 0 THEN 'queued'
                     ELSE 'waiting' END::{schema}.job_state
    FROM unnest(job_ids, changes) AS counted (job_id, change)
    WHERE job.id = counted.job_id AND job.state = 'waiting'
    RETURNING job.*
$$;

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
                 pending_dependencies, has_dependents)
            SELECT cancelled.id, cancelled.queue, cancelled.task, cancelled.payload,
                   cancelled.priority, 'cancelled', cancelled.run_at, cancelled.attempts,
                   cancelled.max_attempts, cancelled.timeout_seconds, cancelled.worker_id,
                   cancelled.enqueued_at, cancelled.started_at, clock_timestamp(),
                   cancelled.reason, cancelled.result, cancelled.idempotency_key,
                   cancelled.errors, cancelled.trace_context, cancelled.unique_key,
                   cancelled.pending_dependencies, cancelled.has_dependents
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
