-- Controls: an operator's queue settings, throttles and the partition keys of a queue.
-- Placeholders and parameters: see pgqueue/queries.py.

-- name: queue_update
-- An operator's change to a queue's settings: each %(set_...)s says whether its value
-- is given (NULL is "no limit"). The queue must exist (jobs or counters of its own, or
-- settings) unless %(create)s; nothing comes back for one that does not. A queue left
-- unpaused notifies its waiting workers, so that a resume or a higher limit is acted
-- on at once rather than at their next poll: rare enough that the notification's lock
-- at commit costs nothing that matters.
WITH known AS (
    SELECT %(queue)s::text AS queue
    WHERE %(create)s
       OR EXISTS (SELECT FROM {schema}.queue_settings WHERE queue = %(queue)s)
       OR EXISTS (SELECT FROM {schema}.active_jobs
                  WHERE state = 'queued' AND queue = %(queue)s AND partition_key IS NULL)
       OR EXISTS (SELECT FROM {schema}.active_jobs
                  WHERE state = 'queued' AND queue = %(queue)s
                    AND partition_key IS NOT NULL)
       OR EXISTS (SELECT FROM {schema}.active_jobs
                  WHERE state = 'running' AND queue = %(queue)s)
       -- Waiting jobs have no index of their own: read in the backlog, which an
       -- operator's call may afford.
       OR EXISTS (SELECT FROM {schema}.active_jobs
                  WHERE state = 'waiting' AND queue = %(queue)s)
       OR EXISTS (SELECT FROM {schema}.queue_counters WHERE queue = %(queue)s)
),
changed AS (
    INSERT INTO {schema}.queue_settings AS setting
        (queue, paused, concurrency_limit, rate_limit, partition_concurrency_limit,
         partition_rate_limit)
    SELECT queue, coalesce(%(paused)s, false), %(concurrency_limit)s, %(rate_limit)s,
           %(partition_concurrency_limit)s, %(partition_rate_limit)s
    FROM known
    ON CONFLICT (queue) DO UPDATE
    SET paused = CASE WHEN %(set_paused)s THEN excluded.paused ELSE setting.paused END,
        concurrency_limit = CASE WHEN %(set_concurrency_limit)s
                                 THEN excluded.concurrency_limit
                                 ELSE setting.concurrency_limit END,
        rate_limit = CASE WHEN %(set_rate_limit)s THEN excluded.rate_limit
                          ELSE setting.rate_limit END,
        partition_concurrency_limit = CASE WHEN %(set_partition_concurrency_limit)s
                                           THEN excluded.partition_concurrency_limit
                                           ELSE setting.partition_concurrency_limit END,
        partition_rate_limit = CASE WHEN %(set_partition_rate_limit)s
                                    THEN excluded.partition_rate_limit
                                    ELSE setting.partition_rate_limit END,
        -- A new rate starts from an empty bucket; the same rate given again keeps its
        -- bucket (a client that sends every setting must not throttle the queue).
        tokens = CASE WHEN %(set_rate_limit)s
                           AND excluded.rate_limit IS DISTINCT FROM setting.rate_limit
                      THEN 0 ELSE setting.tokens END,
        tokens_at = CASE WHEN %(set_rate_limit)s
                              AND excluded.rate_limit IS DISTINCT FROM setting.rate_limit
                         THEN now() ELSE setting.tokens_at END,
        updated_at = now()
    RETURNING setting.queue, setting.paused, setting.concurrency_limit, setting.rate_limit,
              setting.partition_concurrency_limit, setting.partition_rate_limit,
              -- Only a throttle that still holds.
              CASE WHEN setting.throttled_until > now() THEN setting.throttled_until END
                  AS throttled_until
),
woken AS (
    SELECT pg_notify({channel_name}, changed.queue) FROM changed WHERE NOT changed.paused
)
SELECT * FROM changed WHERE (SELECT count(*) FROM woken) >= 0;

-- name: throttle_set
-- An operator's throttle (Queue.throttle): no job of the queue, or of one of its keys,
-- starts before %(seconds)s from now. A later end wins over an earlier one; seconds 0
-- ends a throttle now. Returns when it ends.
WITH of_queue AS (
    INSERT INTO {schema}.queue_settings AS setting (queue, throttled_until)
    SELECT %(queue)s, now() + make_interval(secs => %(seconds)s)
    WHERE %(partition_key)s::text IS NULL
    ON CONFLICT (queue) DO UPDATE
    SET throttled_until = CASE WHEN %(seconds)s = 0 THEN excluded.throttled_until
                               ELSE greatest(setting.throttled_until,
                                             excluded.throttled_until) END
    RETURNING setting.throttled_until
),
of_key AS (
    INSERT INTO {schema}.partition_controls AS control
        (queue, partition_key, throttled_until)
    SELECT %(queue)s, %(partition_key)s, now() + make_interval(secs => %(seconds)s)
    WHERE %(partition_key)s::text IS NOT NULL
    ON CONFLICT (queue, partition_key) DO UPDATE
    SET throttled_until = CASE WHEN %(seconds)s = 0 THEN excluded.throttled_until
                               ELSE greatest(control.throttled_until,
                                             excluded.throttled_until) END
    RETURNING control.throttled_until
)
SELECT throttled_until FROM of_queue UNION ALL SELECT throttled_until FROM of_key;

-- name: partitions_list
-- A queue's partition keys, busiest first (running plus queued, then key), each with
-- its queued and running jobs and the end of its throttle if one holds; keys that only
-- a throttle names are listed too. Paged by the previous page's last (busy, key):
-- %(after_busy)s and %(after_key)s. Reads the queue's queued and running jobs with a
-- key, through their indexes: an operator's call, which grows with the backlog.
WITH counted AS (
    SELECT partition_key,
           count(*) FILTER (WHERE state = 'queued') AS queued,
           count(*) FILTER (WHERE state = 'running') AS running
    FROM (
        SELECT partition_key, state FROM {schema}.active_jobs
        WHERE state = 'queued' AND queue = %(queue)s AND partition_key IS NOT NULL
        UNION ALL
        SELECT partition_key, state FROM {schema}.active_jobs
        WHERE state = 'running' AND queue = %(queue)s AND partition_key IS NOT NULL
    ) AS active
    GROUP BY partition_key
),
listed AS (
    SELECT coalesce(counted.partition_key, control.partition_key) AS partition_key,
           coalesce(counted.queued, 0)::bigint AS queued,
           coalesce(counted.running, 0)::bigint AS running,
           CASE WHEN control.throttled_until > now() THEN control.throttled_until END
               AS throttled_until
    FROM counted
    FULL JOIN (SELECT * FROM {schema}.partition_controls
               WHERE queue = %(queue)s AND throttled_until > now()) AS control
           ON control.partition_key = counted.partition_key
)
SELECT partition_key, queued, running, throttled_until FROM listed
WHERE %(after_key)s::text IS NULL
   OR queued + running < %(after_busy)s::bigint
   OR (queued + running = %(after_busy)s::bigint AND partition_key > %(after_key)s::text)
ORDER BY queued + running DESC, partition_key
LIMIT %(limit)s;

-- name: throttled_partitions
-- Per queue, how many partition keys are throttled now (the gauge
-- pgqueue_throttled_partitions).
SELECT queue, count(*)::bigint AS keys FROM {schema}.partition_controls
WHERE throttled_until > now()
GROUP BY queue
ORDER BY queue;

-- name: partition_controls_prune
-- The reaper's: the keys' rows that hold nothing any more, their throttle passed and
-- their bucket full again (or never spent), so that the next claim finds what a new
-- key would. Rows held right now (a claim spending, a throttle) are left for later.
DELETE FROM {schema}.partition_controls AS control
WHERE ctid = ANY(ARRAY(
    SELECT held.ctid FROM {schema}.partition_controls AS held
    LEFT JOIN {schema}.queue_settings AS setting ON setting.queue = held.queue
    WHERE (held.throttled_until IS NULL OR held.throttled_until <= now())
      AND (held.tokens IS NULL OR setting.partition_rate_limit IS NULL
           OR held.tokens + setting.partition_rate_limit
                  * extract(epoch FROM now() - held.tokens_at)
              >= greatest(1, setting.partition_rate_limit / 10))
    LIMIT %(limit)s
    FOR UPDATE OF held SKIP LOCKED
));
