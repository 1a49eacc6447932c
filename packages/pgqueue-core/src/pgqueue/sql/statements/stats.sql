-- Stats: counts, histograms and the recent history of each queue.
-- Placeholders and parameters: see pgqueue/queries.py.

-- name: jobs_finished_per_minute
-- Jobs finished per queue, state and minute over the last %(minutes)s minutes (the
-- current one included). Reads only the recent rows of today's (and perhaps
-- yesterday's) day partitions, through finished_jobs_finished_at_idx (BRIN), so it
-- costs what the last hour's jobs cost, however much history is kept.
SELECT queue, state::text AS state, date_trunc('minute', finished_at) AS minute,
       count(*)::bigint AS jobs
FROM {schema}.finished_jobs
WHERE finished_at >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1)
GROUP BY queue, state, minute
ORDER BY queue, minute, state;

-- name: queue_stats
-- Counts per queue and state, and the age of the oldest runnable job, in one statement,
-- so one snapshot. Queued and running jobs are counted in active_jobs, which holds no
-- history; finished ones come from the counters the finishing statements keep.
WITH active AS (
    SELECT queue,
           count(*) FILTER (WHERE state = 'waiting') AS waiting,
           count(*) FILTER (WHERE state = 'queued') AS queued,
           count(*) FILTER (WHERE state = 'running') AS running,
           extract(epoch FROM now() - min(run_at) FILTER (
               WHERE state = 'queued' AND run_at <= now()))::float8
               AS oldest_runnable_age_seconds
    FROM {schema}.active_jobs
    GROUP BY queue
),
finished AS (
    SELECT queue, sum(succeeded) AS succeeded, sum(dead) AS dead,
           sum(cancelled) AS cancelled, sum(completed) AS completed,
           sum(failures) AS failures
    FROM {schema}.queue_counters
    GROUP BY queue
)
SELECT queue,
       coalesce(setting.paused, false) AS paused,
       setting.concurrency_limit,
       setting.rate_limit,
       setting.partition_concurrency_limit,
       setting.partition_rate_limit,
       -- Only a throttle that still holds.
       CASE WHEN setting.throttled_until > now() THEN setting.throttled_until END
           AS throttled_until,
       coalesce(active.waiting, 0)::bigint AS waiting,
       coalesce(active.queued, 0)::bigint AS queued,
       coalesce(active.running, 0)::bigint AS running,
       coalesce(finished.succeeded, 0)::bigint AS succeeded,
       coalesce(finished.dead, 0)::bigint AS dead,
       coalesce(finished.cancelled, 0)::bigint AS cancelled,
       coalesce(finished.completed, 0)::bigint AS completed,
       coalesce(finished.failures, 0)::bigint AS failures,
       active.oldest_runnable_age_seconds
FROM active FULL JOIN finished USING (queue)
FULL JOIN {schema}.queue_settings AS setting USING (queue)
-- A queue whose jobs were all pruned still has counters that must not vanish, and a
-- queue an operator configured is shown before its first job.
WHERE coalesce(active.waiting, 0) + coalesce(active.queued, 0) + coalesce(active.running, 0)
      + coalesce(finished.succeeded, 0) + coalesce(finished.dead, 0)
      + coalesce(finished.cancelled, 0) + coalesce(finished.completed, 0)
      + coalesce(finished.failures, 0) > 0
   OR setting.queue IS NOT NULL
ORDER BY queue;

-- name: run_time_histogram
-- The run-time histogram of succeeded attempts per queue and task (see
-- run_time_buckets): each bucket's attempts, not cumulative, in the order of the
-- bounds, and the seconds of them all. A few rows per queue and task, however much
-- history is kept.
WITH bounds AS (
    SELECT {schema}.run_time_bounds() AS le
),
summed AS (
    SELECT queue, task, le, sum(attempts) AS attempts, sum(seconds) AS seconds
    FROM {schema}.run_time_buckets
    GROUP BY queue, task, le
)
SELECT queue, task, bounds.le AS bounds,
       array_agg(summed.attempts::bigint ORDER BY summed.le) AS attempts,
       array_agg(summed.le ORDER BY summed.le) AS les,
       sum(summed.seconds)::float8 AS seconds
FROM summed CROSS JOIN bounds
GROUP BY queue, task, bounds.le
ORDER BY queue, task;

-- name: pickup_histogram
-- The pickup histogram per queue (see pickup_buckets): each bucket's attempts, not
-- cumulative, in the order of the bounds, and the seconds of them all. The attempts
-- that ended come from pickup_buckets (a few rows per queue, however much history is
-- kept); the attempts running now from their rows, through the running jobs' index. In
-- one statement, so one snapshot: an attempt that ends between two reads moves from
-- one part to the other and is counted once in each.
WITH bounds AS (
    SELECT {schema}.pickup_bounds() AS le
),
running AS (
    SELECT queue, {schema}.pickup_seconds(started_at, enqueued_at, run_at) AS seconds
    FROM {schema}.active_jobs
    WHERE state = 'running'
),
observed AS (
    SELECT queue, le, attempts, seconds FROM {schema}.pickup_buckets
    UNION ALL
    SELECT queue, le[position + (position = 0 OR seconds > le[position])::int], 1, seconds
    FROM (
        SELECT queue, seconds, le, width_bucket(seconds, le) AS position
        FROM running, bounds
    ) AS placed
),
summed AS (
    SELECT queue, le, sum(attempts) AS attempts, sum(seconds) AS seconds
    FROM observed
    GROUP BY queue, le
)
SELECT queue, bounds.le AS bounds,
       array_agg(summed.attempts::bigint ORDER BY summed.le) AS attempts,
       array_agg(summed.le ORDER BY summed.le) AS les,
       sum(summed.seconds)::float8 AS seconds
FROM summed CROSS JOIN bounds
GROUP BY queue, bounds.le
ORDER BY queue;
