-- Rollups behind the metrics: jobs per queue and state (gauges), finished and failed
-- attempts per queue (counters), and a histogram of how long jobs waited to start.
--
-- Why rollups: counting from the jobs table gets slower as it holds more history, and
-- once pruning deletes finished rows the completed and failed totals would go backwards.
-- Triggers update the rollups in the same transaction as the change they count, so they
-- are exact, and one statement reads them all in a single snapshot.
--
-- Why statement-level triggers with transition tables: they run once per statement and
-- write one row per queue, however many jobs the statement moved, so a claim or ack of a
-- hundred jobs costs the same rollup write as a claim of one.
--
-- Why slots: a single row per queue would make every claim and ack of that queue wait
-- for the previous one's row lock until it commits. Each queue's figures are spread over
-- 16 slots picked by the backend's pid instead, so concurrent sessions mostly write
-- different rows; readers add the slots up. A slot's own figures may go negative (a job
-- enqueued through one slot and claimed through another); only the sums mean anything.
--
-- Lock order: each trigger writes queue_rollups before start_latency_buckets, and rows in
-- key order, so two single-statement transitions sharing a slot wait for each other but
-- never deadlock. (A caller's own transaction that enqueues into queue a, then b, while
-- another enqueues into b, then a, through the same slot can deadlock; PostgreSQL then
-- aborts one of them, as with any deadlock.)

-- Writers wait until this migration commits, so the seed count at the end is exact.
LOCK TABLE {schema}.jobs IN SHARE ROW EXCLUSIVE MODE;

-- Gauges and counters per queue, split into slots.
CREATE TABLE {schema}.queue_rollups (
    queue     text     NOT NULL,
    slot      smallint NOT NULL,
    -- Jobs now in each state (gauges).
    queued    bigint   NOT NULL DEFAULT 0,
    running   bigint   NOT NULL DEFAULT 0,
    succeeded bigint   NOT NULL DEFAULT 0,
    dead      bigint   NOT NULL DEFAULT 0,
    cancelled bigint   NOT NULL DEFAULT 0,
    -- Attempts that ended running -> succeeded, ever (counter; pruning does not lower it).
    completed bigint   NOT NULL DEFAULT 0,
    -- Attempts that ended running -> queued or dead: failed by the worker or expired and
    -- reaped, ever (counter). A cancel is not a failure.
    failures  bigint   NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, slot)
) WITH (fillfactor = 50);  -- room for HOT updates: these rows change on every transition

-- Enqueue-to-start latency per queue: one row per histogram bucket and slot, counting
-- claims whose wait (started_at - GREATEST(run_at, enqueued_at), i.e. from when the job
-- became runnable) fell in the bucket, and the sum of those waits.
CREATE TABLE {schema}.start_latency_buckets (
    queue       text             NOT NULL,
    le          double precision NOT NULL,  -- the bucket's upper bound in seconds
    slot        smallint         NOT NULL,
    starts      bigint           NOT NULL DEFAULT 0,
    seconds_sum double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, le, slot)
) WITH (fillfactor = 50);

-- The slot this session writes to.
CREATE FUNCTION {schema}.rollup_slot() RETURNS smallint
LANGUAGE sql STABLE AS $$
    SELECT (pg_backend_pid() % 16)::smallint
$$;

-- Histogram bucket upper bounds, in seconds: from a busy queue's milliseconds to a
-- backlog's hour. The last bucket catches everything else.
CREATE FUNCTION {schema}.start_latency_bounds() RETURNS double precision[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
                 900, 3600, 'Infinity']::double precision[]
$$;

-- The bucket a wait of ``seconds`` falls in: the smallest bound at or above it.
CREATE FUNCTION {schema}.start_latency_bucket(seconds double precision)
RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT min(bound) FROM unnest({schema}.start_latency_bounds()) AS bound
    WHERE seconds <= bound
$$;

-- INSERT: new jobs add to their queue's gauges (ON CONFLICT DO NOTHING rows are not in
-- the transition table, so a duplicate idempotency key counts nothing).
CREATE FUNCTION {schema}.rollup_jobs_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.queue_rollups AS r
        (queue, slot, queued, running, succeeded, dead, cancelled)
    SELECT queue, {schema}.rollup_slot(),
           count(*) FILTER (WHERE state = 'queued'),
           count(*) FILTER (WHERE state = 'running'),
           count(*) FILTER (WHERE state = 'succeeded'),
           count(*) FILTER (WHERE state = 'dead'),
           count(*) FILTER (WHERE state = 'cancelled')
    FROM inserted_jobs
    GROUP BY queue
    ORDER BY queue
    ON CONFLICT (queue, slot) DO UPDATE
    SET queued = r.queued + excluded.queued,
        running = r.running + excluded.running,
        succeeded = r.succeeded + excluded.succeeded,
        dead = r.dead + excluded.dead,
        cancelled = r.cancelled + excluded.cancelled;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_rollup_insert
    AFTER INSERT ON {schema}.jobs
    REFERENCING NEW TABLE AS inserted_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.rollup_jobs_inserted();

-- UPDATE: a job that changed state (or queue) moves from one gauge to another; leaving
-- running counts a completed or failed attempt; entering running from queued is a start,
-- whose wait goes into the histogram. Heartbeats change neither and write nothing.
CREATE FUNCTION {schema}.rollup_jobs_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    WITH moved AS (
        SELECT old_row.queue AS old_queue, old_row.state AS old_state,
               new_row.queue AS new_queue, new_row.state AS new_state
        FROM jobs_before AS old_row JOIN jobs_after AS new_row USING (id)
        WHERE old_row.state <> new_row.state OR old_row.queue <> new_row.queue
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
    -- database clock. GREATEST(0, ...) guards against a run_at moved by hand.
    INSERT INTO {schema}.start_latency_buckets AS b (queue, le, slot, starts, seconds_sum)
    SELECT queue, {schema}.start_latency_bucket(wait), {schema}.rollup_slot(),
           count(*), sum(wait)
    FROM (
        SELECT new_row.queue,
               greatest(0, extract(epoch FROM new_row.started_at
                                   - greatest(old_row.run_at, old_row.enqueued_at)))::float8
                   AS wait
        FROM jobs_before AS old_row JOIN jobs_after AS new_row USING (id)
        WHERE old_row.state = 'queued' AND new_row.state = 'running'
    ) AS started
    GROUP BY 1, 2
    ORDER BY 1, 2
    ON CONFLICT (queue, le, slot) DO UPDATE
    SET starts = b.starts + excluded.starts,
        seconds_sum = b.seconds_sum + excluded.seconds_sum;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_rollup_update
    AFTER UPDATE ON {schema}.jobs
    REFERENCING OLD TABLE AS jobs_before NEW TABLE AS jobs_after
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.rollup_jobs_updated();

-- DELETE (pruning): deleted jobs leave the gauges; the counters keep their totals.
CREATE FUNCTION {schema}.rollup_jobs_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.queue_rollups AS r
        (queue, slot, queued, running, succeeded, dead, cancelled)
    SELECT queue, {schema}.rollup_slot(),
           -count(*) FILTER (WHERE state = 'queued'),
           -count(*) FILTER (WHERE state = 'running'),
           -count(*) FILTER (WHERE state = 'succeeded'),
           -count(*) FILTER (WHERE state = 'dead'),
           -count(*) FILTER (WHERE state = 'cancelled')
    FROM deleted_jobs
    GROUP BY queue
    ORDER BY queue
    ON CONFLICT (queue, slot) DO UPDATE
    SET queued = r.queued + excluded.queued,
        running = r.running + excluded.running,
        succeeded = r.succeeded + excluded.succeeded,
        dead = r.dead + excluded.dead,
        cancelled = r.cancelled + excluded.cancelled;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_rollup_delete
    AFTER DELETE ON {schema}.jobs
    REFERENCING OLD TABLE AS deleted_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.rollup_jobs_deleted();

-- TRUNCATE empties every gauge; the counters keep their totals.
CREATE FUNCTION {schema}.rollup_jobs_truncated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {schema}.queue_rollups
    SET queued = 0, running = 0, succeeded = 0, dead = 0, cancelled = 0;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_rollup_truncate
    AFTER TRUNCATE ON {schema}.jobs
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.rollup_jobs_truncated();

-- Seed the gauges from the jobs already there (the lock taken at the top keeps writers
-- out until this migration commits, so nothing is counted twice or missed). The counters
-- and the histogram start from zero: the history before them is unknown.
INSERT INTO {schema}.queue_rollups (queue, slot, queued, running, succeeded, dead, cancelled)
SELECT queue, 0,
       count(*) FILTER (WHERE state = 'queued'),
       count(*) FILTER (WHERE state = 'running'),
       count(*) FILTER (WHERE state = 'succeeded'),
       count(*) FILTER (WHERE state = 'dead'),
       count(*) FILTER (WHERE state = 'cancelled')
FROM {schema}.jobs
GROUP BY queue;
