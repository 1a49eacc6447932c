-- Statements of the queue-controls driver (pgqueue bench controls), on the delivery
-- table the recording handler writes when it starts a job: its delivered_at is the
-- start on the database clock. The jobs table is read through pgqueue.Queue.
--
-- Placeholders: {schema} is the quoted schema of the run. Parameters use psycopg's
-- %(name)s style.

-- name: starts_between
-- Handler starts from %(after)s on and before %(before)s (NULL: no bound on either
-- side): how many, the first and the last.
SELECT count(*) AS starts, min(delivered_at) AS first, max(delivered_at) AS last
FROM {schema}.bench_deliveries
WHERE delivered_at >= coalesce(%(after)s::timestamptz, '-infinity')
  AND delivered_at < coalesce(%(before)s::timestamptz, 'infinity');

-- name: first_starts
-- Each job's first handler start (its first delivery row), on the database clock.
SELECT job_id, min(delivered_at) AS started
FROM {schema}.bench_deliveries
GROUP BY job_id;
