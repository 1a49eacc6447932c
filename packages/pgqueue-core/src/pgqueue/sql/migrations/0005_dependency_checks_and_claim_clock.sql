-- Version 5: an enqueue with dependencies locks nothing until its transaction commits,
-- where a deferred trigger checks the dependencies (dependents_checked); and a claim
-- starts its jobs on the clock after its snapshot (claim_clock). See ../schema.sql for
-- what each part is for.

-- The waiting jobs that a transaction enqueued or retried and whose dependencies it
-- has not checked yet (see dependents_checked): one row each, inserted by the
-- transaction and deleted by its check, at the latest as it commits, so the table is
-- empty to every other transaction. Unlogged: no row outlives its transaction.
CREATE UNLOGGED TABLE {schema}.dependents_to_check (
    job_id bigint PRIMARY KEY
);

-- Checks the dependencies of the waiting jobs this transaction enqueued or retried
-- (its rows of dependents_to_check), which the enqueue read without locking anything:
-- called by the trigger below as the transaction commits, or by pgqueue just before it
-- commits a transaction of its own. fired_by is the row whose trigger calls it: the
-- first firing checks every job of the transaction, the later ones find theirs gone.
--
-- 1. Each dependency still in active_jobs is locked, in id order (so two commits, or a
--    commit and an ack that releases a dependent, never wait for each other in a
--    cycle: a dependent's id is always above its dependencies'), and marked as having
--    dependents. An ack, failure or cancel of it under way is waited for; one that
--    comes later waits for this commit, then reads the mark and finds these jobs. The
--    lock is held from here to the commit, never through the producer's transaction.
-- 2. Each statement of a volatile function takes a new snapshot, so the next ones see
--    whatever those waits let commit. The jobs with a dependency that ended dead or
--    cancelled are cancelled, with their dependents among these jobs in turn; every
--    other one's count of unmet dependencies (those still in active_jobs) is set from
--    scratch, and one with none left is queued, waking its queue's waiting workers on
--    channel. The enqueue's own count was provisional: nothing is counted twice.
--
-- Returns the jobs whose state or count it changed. Runs as the schema's owner: a
-- producer may not change a job's state by itself.
CREATE FUNCTION {schema}.dependents_checked(channel text, fired_by bigint DEFAULT NULL)
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
            SELECT cancelled.queue, mod(pg_backend_pid(), 16), count(*) FROM cancelled
            GROUP BY cancelled.queue ORDER BY cancelled.queue
            ON CONFLICT (queue, slot)
            DO UPDATE SET cancelled = counter.cancelled + excluded.cancelled
        )
        SELECT moved.id, 'cancelled'::text FROM moved;
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

-- Checks the waiting jobs of a transaction as it commits (see dependents_checked), on
-- the schema's channel as pgqueue.settings.notify_channel names it.
CREATE FUNCTION {schema}.dependents_check_at_commit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {schema}.dependents_checked(TG_TABLE_SCHEMA || '_jobs', NEW.job_id);
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER dependents_check_at_commit
    AFTER INSERT ON {schema}.dependents_to_check
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION {schema}.dependents_check_at_commit();

-- The time a claim starts its jobs: their started_at, and the start of their lease.
-- The clock when first asked in a transaction, kept for the rest of it in a setting
-- local to the transaction, so job_claim_times reads back what the claim wrote. The
-- claim asks while its statement runs, after its snapshot was taken: later than the
-- commit of whatever made its jobs runnable (the ack that released a waiting job, say),
-- where the transaction's now() may be earlier. Kept as text in UTC, which reads back
-- the same whatever the session's DateStyle and TimeZone.
CREATE FUNCTION {schema}.claim_clock() RETURNS timestamptz
LANGUAGE sql VOLATILE AS $$
    SELECT coalesce(
        nullif(current_setting('pgqueue.claim_clock', true), '')::timestamp
            AT TIME ZONE 'UTC',
        set_config('pgqueue.claim_clock',
                   to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'),
                   true)::timestamp AT TIME ZONE 'UTC')
$$;
