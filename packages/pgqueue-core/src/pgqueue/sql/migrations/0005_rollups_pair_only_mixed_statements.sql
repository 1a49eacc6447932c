-- Rollups that pair old and new rows only for the statements that need it.
--
-- rollup_jobs_updated() grouped every UPDATE's old and new rows by id, twice: once for
-- the gauges and counters, once for the start-latency histogram. Most of that pairing
-- is not needed:
-- - Gauges are counts per queue and state: every old row leaves its (queue, state) and
--   every new row enters its own, whichever row is which.
-- - Counters count attempts that ended, i.e. rows that were running. When every old row
--   was running (an ack, a failure, a reap), each new row's state says how its attempt
--   ended; when none was (a claim, a cancel of queued jobs), none ended.
-- - The histogram counts claims, rows that were queued and now run. When every old row
--   was queued (a claim), every new running row is a claim, and its wait is measured
--   from its own run_at and enqueued_at, which a claim leaves as they were.
-- Only a statement that mixes running (or queued) rows with others still pairs them,
-- and it does so in a statement of its own, which the others never run. The rollups,
-- and the order in which they are written, are unchanged; a heartbeat, which moves
-- nothing, still writes nothing.

CREATE OR REPLACE FUNCTION {schema}.rollup_jobs_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    every_old_running boolean;
    some_old_running boolean;
    every_old_queued boolean;
    some_old_queued boolean;
    -- Attempts ended by a statement that mixes running rows with others, per queue.
    ended_queues text[];
    ended_completed bigint[];
    ended_failed bigint[];
    -- The claims among the rows: each one's queue and wait in seconds.
    claim_queues text[];
    claim_waits double precision[];
BEGIN
    SELECT bool_and(state = 'running'), bool_or(state = 'running'),
           bool_and(state = 'queued'), bool_or(state = 'queued')
    INTO every_old_running, some_old_running, every_old_queued, some_old_queued
    FROM jobs_before;
    IF every_old_running IS NULL THEN
        RETURN NULL;  -- the statement changed no row
    END IF;

    IF some_old_running AND NOT every_old_running THEN
        SELECT array_agg(new_queue), array_agg(completed), array_agg(failed)
        INTO ended_queues, ended_completed, ended_failed
        FROM (
            SELECT new_queue,
                   count(*) FILTER (WHERE new_state = 'succeeded') AS completed,
                   count(*) FILTER (WHERE new_state IN ('queued', 'dead')) AS failed
            FROM (
                SELECT max(queue) FILTER (WHERE side > 0) AS new_queue,
                       max(state) FILTER (WHERE side < 0) AS old_state,
                       max(state) FILTER (WHERE side > 0) AS new_state
                FROM (SELECT id, queue, state, -1 AS side FROM jobs_before
                      UNION ALL
                      SELECT id, queue, state, 1 FROM jobs_after) AS sides
                GROUP BY id
            ) AS paired
            WHERE old_state = 'running'
            GROUP BY new_queue
        ) AS ended;
    END IF;

    INSERT INTO {schema}.queue_rollups AS r
        (queue, slot, queued, running, succeeded, dead, cancelled, completed, failures)
    SELECT queue, {schema}.rollup_slot(), sum(queued), sum(running), sum(succeeded),
           sum(dead), sum(cancelled), sum(completed), sum(failures)
    FROM (
        SELECT queue,
               coalesce(sum(sign) FILTER (WHERE state = 'queued'), 0) AS queued,
               coalesce(sum(sign) FILTER (WHERE state = 'running'), 0) AS running,
               coalesce(sum(sign) FILTER (WHERE state = 'succeeded'), 0) AS succeeded,
               coalesce(sum(sign) FILTER (WHERE state = 'dead'), 0) AS dead,
               coalesce(sum(sign) FILTER (WHERE state = 'cancelled'), 0) AS cancelled,
               -- Every old row was running: the new rows say how the attempts ended.
               count(*) FILTER (WHERE every_old_running AND sign > 0
                                AND state = 'succeeded') AS completed,
               count(*) FILTER (WHERE every_old_running AND sign > 0
                                AND state IN ('queued', 'dead')) AS failures
        FROM (SELECT queue, state, -1 AS sign FROM jobs_before
              UNION ALL
              SELECT queue, state, 1 FROM jobs_after) AS signed
        GROUP BY queue
        UNION ALL
        SELECT queue, 0, 0, 0, 0, 0, completed, failed
        FROM unnest(ended_queues, ended_completed, ended_failed) AS ended (queue, completed, failed)
    ) AS changes
    GROUP BY queue
    HAVING sum(abs(queued) + abs(running) + abs(succeeded) + abs(dead) + abs(cancelled)
               + completed + failures) > 0
    ORDER BY queue
    ON CONFLICT (queue, slot) DO UPDATE
    SET queued = r.queued + excluded.queued,
        running = r.running + excluded.running,
        succeeded = r.succeeded + excluded.succeeded,
        dead = r.dead + excluded.dead,
        cancelled = r.cancelled + excluded.cancelled,
        completed = r.completed + excluded.completed,
        failures = r.failures + excluded.failures;

    -- Claims: started_at is set by the claim itself, so the wait is measured on the
    -- database clock. GREATEST(0, ...) guards against a run_at moved by hand.
    IF every_old_queued THEN
        SELECT array_agg(queue),
               array_agg(greatest(0, extract(epoch FROM started_at - greatest(run_at, enqueued_at)))::float8)
        INTO claim_queues, claim_waits
        FROM jobs_after
        WHERE state = 'running';
    ELSIF some_old_queued THEN
        SELECT array_agg(new_queue),
               array_agg(greatest(0, extract(epoch FROM started_at - waited_from))::float8)
        INTO claim_queues, claim_waits
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
        WHERE old_state = 'queued' AND new_state = 'running';
    END IF;
    IF claim_queues IS NULL THEN
        RETURN NULL;
    END IF;
    -- A wait falls in the bucket of the smallest bound at or above it: width_bucket()
    -- gives the largest bound at or below it, and the next one unless the wait equals
    -- that bound.
    INSERT INTO {schema}.start_latency_buckets AS b (queue, le, slot, starts, seconds_sum)
    SELECT started.queue,
           bounds.le[position + (position = 0 OR started.wait > bounds.le[position])::int],
           {schema}.rollup_slot(), count(*), sum(started.wait)
    FROM unnest(claim_queues, claim_waits) AS started (queue, wait)
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
