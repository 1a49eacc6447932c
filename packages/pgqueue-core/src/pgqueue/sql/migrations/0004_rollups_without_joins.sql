-- Rollups that pair each job's old and new row by grouping, not by joining.
--
-- rollup_jobs_updated() joined each UPDATE's old and new rows (its transition tables)
-- on id. The planner has no statistics for transition tables and estimates them at
-- one row each, so it joined them with a nested loop, comparing every old row with
-- every new one. That was cheap for a claim of 32 jobs and quadratic for the batches
-- of hundreds a prefetching worker claims and acks, in every claim, ack and heartbeat
-- statement. Forbidding nested loops is no cure: PostgreSQL 15 then hashes the same
-- join at that one-row estimate and takes longer still.
--
-- Both statements now stack the old rows (sign -1) on the new ones (sign +1) and
-- group them by id, which costs a sort or a hash of the rows at any size. What they
-- compute, and the order in which they lock the rollup rows, are unchanged.

CREATE OR REPLACE FUNCTION {schema}.rollup_jobs_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    WITH moved AS (
        SELECT old_queue, old_state, new_queue, new_state
        FROM (
            SELECT max(queue) FILTER (WHERE side < 0) AS old_queue,
                   max(state) FILTER (WHERE side < 0) AS old_state,
                   max(queue) FILTER (WHERE side > 0) AS new_queue,
                   max(state) FILTER (WHERE side > 0) AS new_state
            FROM (SELECT id, queue, state, -1 AS side FROM jobs_before
                  UNION ALL
                  SELECT id, queue, state, 1 FROM jobs_after) AS sides
            GROUP BY id
        ) AS paired
        WHERE old_state <> new_state OR old_queue <> new_queue
    ),
    signed AS (
        SELECT new_queue AS queue, new_state AS state, 1 AS sign,
               old_state = 'running' AND new_state = 'succeeded' AS completed,
               old_state = 'running' AND new_state IN ('queued', 'dead') AS failed
        FROM moved
        UNION ALL
        SELECT old_queue, old_state, -1, false, false FROM moved
    )
    INSERT INTO {schema}.queue_rollups AS r
        (queue, slot, queued, running, succeeded, dead, cancelled, completed, failures)
    SELECT queue, {schema}.rollup_slot(),
           coalesce(sum(sign) FILTER (WHERE state = 'queued'), 0),
           coalesce(sum(sign) FILTER (WHERE state = 'running'), 0),
           coalesce(sum(sign) FILTER (WHERE state = 'succeeded'), 0),
           coalesce(sum(sign) FILTER (WHERE state = 'dead'), 0),
           coalesce(sum(sign) FILTER (WHERE state = 'cancelled'), 0),
           count(*) FILTER (WHERE completed),
           count(*) FILTER (WHERE failed)
    FROM signed
    GROUP BY queue
    ORDER BY queue
    ON CONFLICT (queue, slot) DO UPDATE
    SET queued = r.queued + excluded.queued,
        running = r.running + excluded.running,
        succeeded = r.succeeded + excluded.succeeded,
        dead = r.dead + excluded.dead,
        cancelled = r.cancelled + excluded.cancelled,
        completed = r.completed + excluded.completed,
        failures = r.failures + excluded.failures;

    -- Claims only: started_at is set by the claim itself, so the wait is measured on the
    -- database clock. GREATEST(0, ...) guards against a run_at moved by hand. A wait
    -- falls in the bucket of the smallest bound at or above it: width_bucket() gives the
    -- largest bound at or below it, and the next one unless the wait equals that bound.
    INSERT INTO {schema}.start_latency_buckets AS b (queue, le, slot, starts, seconds_sum)
    SELECT started.queue,
           bounds.le[position + (position = 0 OR started.wait > bounds.le[position])::int],
           {schema}.rollup_slot(), count(*), sum(started.wait)
    FROM (
        SELECT new_queue AS queue,
               greatest(0, extract(epoch FROM started_at - waited_from))::float8 AS wait
        FROM (
            SELECT max(queue) FILTER (WHERE side > 0) AS new_queue,
                   max(state) FILTER (WHERE side < 0) AS old_state,
                   max(state) FILTER (WHERE side > 0) AS new_state,
                   max(started_at) FILTER (WHERE side > 0) AS started_at,
                   max(greatest(run_at, enqueued_at)) FILTER (WHERE side < 0) AS waited_from
            FROM (SELECT id, queue, state, started_at, run_at, enqueued_at, -1 AS side
                  FROM jobs_before
                  UNION ALL
                  SELECT id, queue, state, started_at, run_at, enqueued_at, 1
                  FROM jobs_after) AS sides
            GROUP BY id
        ) AS paired
        WHERE old_state = 'queued' AND new_state = 'running'
    ) AS started
    CROSS JOIN (SELECT {schema}.start_latency_bounds() AS le) AS bounds
    CROSS JOIN LATERAL width_bucket(started.wait, bounds.le) AS position
    GROUP BY 1, 2
    ORDER BY 1, 2
    ON CONFLICT (queue, le, slot) DO UPDATE
    SET starts = b.starts + excluded.starts,
        seconds_sum = b.seconds_sum + excluded.seconds_sum;
    RETURN NULL;
END;
$$;
