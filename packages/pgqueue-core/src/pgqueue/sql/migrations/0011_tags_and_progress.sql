-- Version 11: jobs carry tags and report their progress, and the queued and running
-- jobs can be searched by tag and by payload containment through indexes.
--
-- The new columns are nullable, without defaults, so adding them rewrites nothing and
-- takes only a brief ACCESS EXCLUSIVE lock on each table. Workers and producers of an
-- earlier version keep working: their INSERTs name their columns and leave these NULL,
-- and the statements with which they move a job between the tables carry only the
-- columns they know, so a job they finish loses its tags and progress (it had none
-- unless a newer producer enqueued it).
--
-- The two indexes are built by a plain CREATE INDEX, inside this migration's
-- transaction: it holds a SHARE lock on active_jobs while it reads the table, which
-- blocks enqueues, claims and acks (not reads) for as long as the build takes. That
-- grows with the backlog, not with the history (`pgqueue bench search` measures it:
-- results/search.json has the build over 1M queued jobs). With a large backlog, build
-- the two indexes beforehand with CREATE INDEX CONCURRENTLY, under the same names and
-- definitions (after adding the columns): this migration then leaves them be.
-- finished_jobs gets no index: searching history reads its partitions (see
-- docs/http-api.md). See ../schema.sql for what each part is for.

ALTER TABLE {schema}.active_jobs
    ADD COLUMN IF NOT EXISTS tags text[], ADD COLUMN IF NOT EXISTS progress jsonb;
ALTER TABLE {schema}.finished_jobs
    ADD COLUMN IF NOT EXISTS tags text[], ADD COLUMN IF NOT EXISTS progress jsonb;

-- The view's columns were fixed when it was made: make it again, with the new ones.
CREATE OR REPLACE VIEW {schema}.jobs AS
    SELECT * FROM {schema}.active_jobs
    UNION ALL
    SELECT * FROM {schema}.finished_jobs;

CREATE INDEX IF NOT EXISTS active_jobs_tags_idx ON {schema}.active_jobs USING gin (tags)
    WHERE tags IS NOT NULL;

CREATE INDEX IF NOT EXISTS active_jobs_payload_idx ON {schema}.active_jobs
    USING gin (payload jsonb_path_ops);

-- A waiting job cancelled because a dependency failed keeps its tags and progress.
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
                 tags, progress)
            SELECT cancelled.id, cancelled.queue, cancelled.task, cancelled.payload,
                   cancelled.priority, 'cancelled', cancelled.run_at, cancelled.attempts,
                   cancelled.max_attempts, cancelled.timeout_seconds, cancelled.worker_id,
                   cancelled.enqueued_at, cancelled.started_at, clock_timestamp(),
                   cancelled.reason, cancelled.result, cancelled.idempotency_key,
                   cancelled.errors, cancelled.trace_context, cancelled.unique_key,
                   cancelled.pending_dependencies, cancelled.has_dependents,
                   cancelled.tags, cancelled.progress
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
