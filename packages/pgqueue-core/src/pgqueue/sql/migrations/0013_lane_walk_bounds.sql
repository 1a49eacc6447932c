-- Version 13: the fair-share walk's steps (lane_after) read only the index entries
-- they return. In version 12, two of its conditions combined a test of an argument with
-- one of the row ("NOT wrapped OR key <= turn", "priority IS NULL OR priority <
-- priority"): PostgreSQL applied them as filters, not as bounds of the index scan, so
-- the walk's last step, or the first after it wrapped, read every queued job with a key
-- of the queue. A claim beside a backlog of 20,000 jobs with keys read about 20,000
-- index entries more than it took, and a drain over many keys got slower the longer
-- its backlog. Each condition is now a branch of its own. Nothing else changes: the
-- function returns what it did, and workers of version 12 call it as they did. See
-- ../schema.sql for what each part is for.

CREATE OR REPLACE FUNCTION {schema}.lane_after(
    queue text, task text, turn text, priority smallint, partition_key text,
    wrapped boolean)
RETURNS TABLE (lane_priority smallint, lane_key text, lane_wrapped boolean,
              lane_run_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT found.priority, found.partition_key, found.wrapped, found.run_at
    FROM (
        -- The next key of the same priority, before the walk wrapped...
        (SELECT job.priority, job.partition_key, false AS wrapped, job.run_at
         FROM {schema}.active_jobs AS job
         WHERE job.state = 'queued' AND job.partition_key IS NOT NULL
           AND job.queue = lane_after.queue AND job.task = lane_after.task
           AND job.priority = lane_after.priority
           AND NOT lane_after.wrapped
           AND job.partition_key > lane_after.partition_key
         ORDER BY job.partition_key, job.run_at, job.id
         LIMIT 1)
        UNION ALL
        -- ...or after, up to the turn. Every condition on the row is a bound of the
        -- index scan, and the ones on the arguments alone decide whether the branch
        -- runs at all: a condition such as "NOT wrapped OR key <= turn" would be a
        -- filter, and its scan would read every queued job of the keys past the turn.
        (SELECT job.priority, job.partition_key, true, job.run_at
         FROM {schema}.active_jobs AS job
         WHERE job.state = 'queued' AND job.partition_key IS NOT NULL
           AND job.queue = lane_after.queue AND job.task = lane_after.task
           AND job.priority = lane_after.priority
           AND lane_after.wrapped
           AND job.partition_key > lane_after.partition_key
           AND job.partition_key <= lane_after.turn
         ORDER BY job.partition_key, job.run_at, job.id
         LIMIT 1)
        UNION ALL
        -- Wrapping: the first key of the same priority, up to the turn.
        (SELECT job.priority, job.partition_key, true, job.run_at
         FROM {schema}.active_jobs AS job
         WHERE job.state = 'queued' AND job.partition_key IS NOT NULL
           AND job.queue = lane_after.queue AND job.task = lane_after.task
           AND job.priority = lane_after.priority
           AND NOT lane_after.wrapped AND job.partition_key <= lane_after.turn
         ORDER BY job.partition_key, job.run_at, job.id
         LIMIT 1)
        UNION ALL
        -- The next lower priority (the highest, for the first lane), from its first
        -- key after the turn, or its first key.
        (SELECT lower.priority, first.partition_key, first.wrapped, first.run_at
         FROM (
             SELECT candidate.priority
             FROM (
                 (SELECT job.priority
                  FROM {schema}.active_jobs AS job
                  WHERE job.state = 'queued' AND job.partition_key IS NOT NULL
                    AND job.queue = lane_after.queue AND job.task = lane_after.task
                    AND lane_after.priority IS NULL
                  ORDER BY job.priority DESC
                  LIMIT 1)
                 UNION ALL
                 (SELECT job.priority
                  FROM {schema}.active_jobs AS job
                  WHERE job.state = 'queued' AND job.partition_key IS NOT NULL
                    AND job.queue = lane_after.queue AND job.task = lane_after.task
                    AND job.priority < lane_after.priority
                  ORDER BY job.priority DESC
                  LIMIT 1)
             ) AS candidate
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
