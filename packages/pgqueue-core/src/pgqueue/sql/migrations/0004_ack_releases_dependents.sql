-- Version 4: an ack queues the dependents of the jobs it acked from within its own
-- statement, and only when one of them has dependents. See ../schema.sql for what
-- each part is for.

-- The waiting jobs that depend on the jobs in acked (just acked, by the calling
-- statement) count them off their pending dependencies, and the ones left with none
-- become queued, waking their queues' workers on channel (see job_ack_many, the only
-- caller). Returns how many became queued. Volatile, so its statement takes a new
-- snapshot: it sees the dependency rows of an enqueue that the calling ack waited for.
-- Two acks of a job's last two dependencies take turns on its row, and the second one
-- counts from what the first left, so the job is queued exactly once.
CREATE FUNCTION {schema}.dependents_released(acked bigint[], channel text) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    WITH met AS (
        SELECT dependency.job_id, count(*)::int AS jobs
        FROM {schema}.job_dependencies AS dependency
        WHERE dependency.depends_on = ANY(acked)
        GROUP BY dependency.job_id
    ),
    released AS (
        UPDATE {schema}.active_jobs AS job
        SET pending_dependencies = job.pending_dependencies - met.jobs,
            state = CASE WHEN job.pending_dependencies - met.jobs <= 0 THEN 'queued'
                         ELSE 'waiting' END::{schema}.job_state
        FROM met
        WHERE job.id = met.job_id AND job.state = 'waiting'
        RETURNING job.id, job.queue, job.state
    ),
    woken AS (
        SELECT pg_notify(channel, wanted.queue)
        FROM (SELECT DISTINCT queue FROM released WHERE state = 'queued') AS wanted
        WHERE EXISTS (
            SELECT FROM {schema}.queue_waiters AS waiter
            WHERE waiter.queue = wanted.queue AND waiter.expires_at > now()
        )
    )
    SELECT count(*) FILTER (WHERE state = 'queued') FROM released
    WHERE (SELECT count(*) FROM woken) >= 0
$$;
