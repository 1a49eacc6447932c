-- What the side-by-side runs read from each peer's own tables after a run. Every
-- timestamp is the database clock's.

-- name: procrastinate_report
-- Jobs succeeded, the most times one job was started, and first start to last
-- success in seconds (procrastinate records each transition in procrastinate_events).
SELECT (SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded') AS completed,
       (SELECT count(*) FROM procrastinate_jobs) AS jobs,
       (SELECT coalesce(max(starts), 0) FROM (
            SELECT count(*) AS starts FROM procrastinate_events
            WHERE type = 'started' GROUP BY job_id) AS per_job) AS most_starts_of_one_job,
       extract(epoch FROM
           (SELECT max(at) FROM procrastinate_events WHERE type = 'succeeded')
           - (SELECT min(at) FROM procrastinate_events WHERE type = 'started'))::float8 AS seconds;

-- name: procrastinate_latencies
-- Per job: first start minus deferral, in milliseconds.
SELECT extract(epoch FROM
           min(at) FILTER (WHERE type = 'started') - min(at) FILTER (WHERE type = 'deferred')
       )::float8 * 1000 AS latency_ms
FROM procrastinate_events
GROUP BY job_id
HAVING min(at) FILTER (WHERE type = 'started') IS NOT NULL;

-- name: pgqueuer_report
-- PgQueuer deletes a finished job from its queue table and logs every transition
-- (queued, picked, successful) in pgqueuer_log.
SELECT count(*) FILTER (WHERE status = 'successful') AS completed,
       (SELECT count(*) FROM pgqueuer) AS left_in_queue,
       (SELECT coalesce(max(picks), 0) FROM (
            SELECT count(*) AS picks FROM pgqueuer_log
            WHERE status = 'picked' GROUP BY job_id) AS per_job) AS most_starts_of_one_job,
       extract(epoch FROM
           max(created) FILTER (WHERE status = 'successful')
           - min(created) FILTER (WHERE status = 'picked'))::float8 AS seconds
FROM pgqueuer_log;

-- name: pgqueuer_latencies
-- Per job: first pick minus enqueue, in milliseconds.
SELECT extract(epoch FROM
           min(created) FILTER (WHERE status = 'picked')
           - min(created) FILTER (WHERE status = 'queued')
       )::float8 * 1000 AS latency_ms
FROM pgqueuer_log
GROUP BY job_id
HAVING min(created) FILTER (WHERE status = 'picked') IS NOT NULL;
