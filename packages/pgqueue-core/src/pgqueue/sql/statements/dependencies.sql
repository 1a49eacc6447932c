-- Dependencies: jobs that wait for other jobs, and the workflow they form.
-- Placeholders and parameters: see pgqueue/queries.py.

-- name: job_dependency_states
-- Before a job that depends on %(ids)s is inserted, in the same transaction: each
-- dependency's state, NULL for an id found nowhere. Nothing is locked: the transaction
-- checks its dependencies again as it commits (see dependents_checked in schema.sql),
-- so that its dependencies' heartbeats, acks and claims never wait for it, however
-- long it stays open. One statement, one snapshot: a job moving from active_jobs to
-- finished_jobs is found in one of them.
SELECT wanted.id, coalesce(active.state, finished.state)::text AS state
FROM unnest(%(ids)s::bigint[]) AS wanted (id)
LEFT JOIN {schema}.active_jobs AS active ON active.id = wanted.id
LEFT JOIN LATERAL (
    SELECT job.state FROM {schema}.finished_jobs AS job
    WHERE job.id = wanted.id AND active.id IS NULL
    LIMIT 1
) AS finished ON true;

-- name: job_dependencies_insert
-- The dependencies of jobs just inserted: one row per (job, dependency) pair, with its
-- place in depends_on and the job's mode; and the %(waiting)s jobs among them, for
-- their transaction to check as it commits (see dependents_checked in schema.sql).
WITH linked AS (
    INSERT INTO {schema}.job_dependencies (depends_on, job_id, position, finished_mode)
    SELECT depends_on, job_id, position, finished_mode
    FROM unnest(%(depends_on)s::bigint[], %(job_ids)s::bigint[], %(positions)s::int[],
                %(finished_modes)s::boolean[])
         AS pair (depends_on, job_id, position, finished_mode)
    ON CONFLICT DO NOTHING
)
INSERT INTO {schema}.dependents_to_check (job_id)
SELECT unnest(%(waiting)s::bigint[]);

-- name: dependents_check
-- dependents_checked (schema.sql), called by a transaction of pgqueue's own just
-- before it commits, rather than by the commit's trigger: the jobs whose state or count
-- it changed. It runs its own statements: read the jobs again in a new one.
SELECT job_id, state FROM {schema}.dependents_checked({channel_name});

-- name: job_dependencies_failed
-- The dependencies of a job that ended dead or cancelled (a retry of it is refused).
SELECT job.id, job.state::text AS state
FROM {schema}.job_dependencies AS link
JOIN {schema}.finished_jobs AS job ON job.id = link.depends_on
WHERE link.job_id = %(id)s AND job.state IN ('dead', 'cancelled') AND NOT link.finished_mode
ORDER BY job.id;

-- name: job_dependents_cancel
-- waiting -> cancelled for the jobs that depend on %(ids)s, which ended dead or
-- cancelled (%(states)s): each one's last_error names the dependency. A dependent in
-- 'finished' mode is not cancelled: these count off its pending dependencies, as an
-- ack does in dependents_released, and one left with none is queued. With %(among)s,
-- only those of these jobs (an enqueue's own, whose dependency it found dead). One
-- level: the caller runs it again for the cancelled jobs that have dependents of their
-- own, each time in a new statement, so that it sees dependents whose transaction
-- committed while a cancel here waited for a row. finished_at is the clock: a later
-- level, or an enqueue in a transaction begun long before, must not end before the
-- dependency it names.
WITH failed AS (
    SELECT id, state FROM unnest(%(ids)s::bigint[], %(states)s::text[]) AS failed (id, state)
),
doomed AS (
    SELECT DISTINCT ON (dependency.job_id)
           dependency.job_id,
           'dependency ' || failed.id || ' ended ' || failed.state AS reason
    FROM {schema}.job_dependencies AS dependency
    JOIN failed ON failed.id = dependency.depends_on
    WHERE (%(among)s::bigint[] IS NULL OR dependency.job_id = ANY(%(among)s::bigint[]))
      AND NOT dependency.finished_mode
    ORDER BY dependency.job_id, failed.id
),
met AS (
    -- With %(among)s, only the enqueue's own jobs that this cascade cancelled count:
    -- its finished-mode jobs counted them as unmet (they were waiting), but not the
    -- dependencies already dead or cancelled before it.
    SELECT dependency.job_id, count(*)::int AS jobs
    FROM {schema}.job_dependencies AS dependency
    JOIN failed ON failed.id = dependency.depends_on
    WHERE (%(among)s::bigint[] IS NULL OR (dependency.job_id = ANY(%(among)s::bigint[])
                                           AND failed.id = ANY(%(among)s::bigint[])))
      AND dependency.finished_mode
    GROUP BY dependency.job_id
),
released AS (
    -- Through a function of the schema's owner: a producer's cancel comes here.
    SELECT * FROM {schema}.finished_dependents_recounted(
        ARRAY(SELECT job_id FROM met ORDER BY job_id),
        ARRAY(SELECT -jobs FROM met ORDER BY job_id)
    )
),
woken AS (
    SELECT pg_notify({channel_name}, wanted.queue)
    FROM (SELECT DISTINCT queue FROM released WHERE state = 'queued') AS wanted
    WHERE EXISTS (
        SELECT FROM {schema}.queue_waiters AS waiter
        WHERE waiter.queue = wanted.queue AND waiter.expires_at > now()
    )
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
         timeout_seconds, worker_id, enqueued_at, started_at, finished_at, last_error,
         result, idempotency_key, errors, trace_context, unique_key, pending_dependencies,
         has_dependents, tags, progress, partition_key)
    SELECT id, queue, task, payload, priority, 'cancelled', run_at, attempts, max_attempts,
           timeout_seconds, worker_id, enqueued_at, started_at, clock_timestamp(), reason,
           result, idempotency_key, errors, trace_context, unique_key, pending_dependencies,
           has_dependents, tags, progress, partition_key
    FROM cancelled
    RETURNING *
),
counted AS (
    INSERT INTO {schema}.queue_counters AS counter (queue, slot, cancelled)
    SELECT queue, {schema}.counter_slot(), count(*) FROM cancelled
    GROUP BY queue ORDER BY queue
    ON CONFLICT (queue, slot) DO UPDATE SET cancelled = counter.cancelled + excluded.cancelled
),
watched AS (
    -- The cancelled jobs that someone waits for, announced as in job_finish_many.
    SELECT pg_notify({done_channel_name}, cancelled.id::text)
    FROM cancelled
    WHERE EXISTS (SELECT FROM {schema}.job_waiters)
      AND EXISTS (SELECT FROM {schema}.job_waiters AS waiter WHERE waiter.job_id = cancelled.id)
)
-- The jobs cancelled, then those released (released true), which changed too.
SELECT moved.*, false AS released FROM moved
WHERE (SELECT count(*) FROM watched) >= 0
UNION ALL
SELECT released.*, true FROM released
WHERE (SELECT count(*) FROM woken) >= 0;

-- name: job_dependencies_get
-- The jobs a job depends on, and the jobs that depend on it, ids ascending.
SELECT ARRAY(SELECT depends_on FROM {schema}.job_dependencies
             WHERE job_id = %(id)s ORDER BY depends_on) AS depends_on,
       ARRAY(SELECT job_id FROM {schema}.job_dependencies
             WHERE depends_on = %(id)s ORDER BY job_id) AS dependents,
       coalesce((SELECT bool_or(finished_mode) FROM {schema}.job_dependencies
                 WHERE job_id = %(id)s), false) AS finished_mode;

-- name: job_dependencies_of_many
-- What the jobs %(ids)s depended on, for their handlers (Job.dependencies): each
-- dependency's id, task, state and result, in the order depends_on named them (links
-- written before pgqueue kept the order come after, by id). A dependency that was
-- pruned is found nowhere: its task, state and result are NULL. By id, one row at a
-- time from each table: what this reads grows with the dependencies, not the history.
SELECT link.job_id, link.depends_on AS id, link.finished_mode, dependency.task,
       dependency.state::text AS state, dependency.result
FROM {schema}.job_dependencies AS link
LEFT JOIN LATERAL (
    SELECT job.task, job.state, job.result FROM {schema}.jobs AS job
    WHERE job.id = link.depends_on
    LIMIT 1
) AS dependency ON true
WHERE link.job_id = ANY(%(ids)s::bigint[])
ORDER BY link.job_id, link.position NULLS LAST, link.depends_on;

-- name: job_neighbours_get
-- A job's page: the first %(limit)s jobs it depends on and the first %(limit)s that
-- depend on it, ids ascending, each with its task and state (NULL: pruned since), and
-- how many there are each way. Through the links' primary key and job_id index, and
-- one lookup by id per job shown, however large the fan-in or fan-out.
WITH shown AS (
    (SELECT 'depends_on' AS direction, depends_on AS id FROM {schema}.job_dependencies
     WHERE job_id = %(id)s ORDER BY depends_on LIMIT %(limit)s)
    UNION ALL
    (SELECT 'dependents', job_id FROM {schema}.job_dependencies
     WHERE depends_on = %(id)s ORDER BY job_id LIMIT %(limit)s)
)
SELECT shown.direction, shown.id, job.task, job.queue, job.state::text AS state,
       (SELECT count(*) FROM {schema}.job_dependencies WHERE job_id = %(id)s)
           AS depends_on_total,
       (SELECT count(*) FROM {schema}.job_dependencies WHERE depends_on = %(id)s)
           AS dependents_total
FROM (SELECT 1) AS one
LEFT JOIN shown ON true
-- One lookup by id per job shown. A join would let the planner, which cannot tell how
-- few they are, read every finished job to hash or merge them in; LIMIT 1 (an id is
-- one job) keeps it from flattening this LATERAL subquery into such a join.
LEFT JOIN LATERAL (SELECT task, queue, state FROM {schema}.jobs WHERE id = shown.id LIMIT 1)
    AS job ON true
ORDER BY shown.direction, shown.id;

-- name: job_workflow_get
-- The graph around a job: the job, the jobs it depends on, directly or not (its
-- ancestors), and the jobs that depend on it (its descendants), each with its task,
-- queue and state (NULL: pruned, its link kept by a job that is not), and with the ids
-- of its dependencies among them (the edges). Each walk is breadth-first, and its UNION
-- visits each job once, so it ends on any graph (the enqueue cannot make a cycle, but
-- nothing here relies on that); its LIMIT stops it after the job and %(limit)s more,
-- nearest first, which bounds the depth as well as the breadth, since every level adds
-- a job. more_dependencies (of an ancestor) and more_dependents (of a descendant) count
-- the links that lead out of the graph: ancestors and descendants left out by a LIMIT.
-- Everything goes through the links' job_id index and primary key, and jobs by id.
WITH RECURSIVE ancestors (id) AS (
    SELECT %(id)s::bigint
    UNION
    SELECT link.depends_on FROM ancestors
    JOIN {schema}.job_dependencies AS link ON link.job_id = ancestors.id
),
descendants (id) AS (
    SELECT %(id)s::bigint
    UNION
    SELECT link.job_id FROM descendants
    JOIN {schema}.job_dependencies AS link ON link.depends_on = descendants.id
),
found AS MATERIALIZED (
    (SELECT id, true AS ancestor FROM ancestors LIMIT %(limit)s + 1)
    UNION ALL
    (SELECT id, false FROM descendants LIMIT %(limit)s + 1)
),
nodes AS MATERIALIZED (
    SELECT id, bool_or(ancestor) AS ancestor, bool_or(NOT ancestor) AS descendant
    FROM found GROUP BY id
)
SELECT nodes.id, job.task, job.queue, job.state::text AS state,
       ARRAY(SELECT link.depends_on FROM {schema}.job_dependencies AS link
             WHERE link.job_id = nodes.id AND link.depends_on IN (SELECT id FROM nodes)
             ORDER BY link.depends_on) AS depends_on,
       CASE WHEN nodes.ancestor THEN
           (SELECT count(*) FROM {schema}.job_dependencies AS link
            WHERE link.job_id = nodes.id AND link.depends_on NOT IN (SELECT id FROM nodes))
       ELSE 0 END AS more_dependencies,
       CASE WHEN nodes.descendant THEN
           (SELECT count(*) FROM {schema}.job_dependencies AS link
            WHERE link.depends_on = nodes.id AND link.job_id NOT IN (SELECT id FROM nodes))
       ELSE 0 END AS more_dependents
FROM nodes
-- One lookup by id per job, never a read of the history (see job_neighbours_get).
LEFT JOIN LATERAL (SELECT task, queue, state FROM {schema}.jobs WHERE id = nodes.id LIMIT 1)
    AS job ON true
ORDER BY nodes.id;
