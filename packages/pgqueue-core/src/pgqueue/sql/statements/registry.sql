-- Registry: the live workers, and the queued jobs no worker serves.
-- Placeholders and parameters: see pgqueue/queries.py.

-- name: worker_register
-- A worker that starts, or starts again under the same id: its row in the registry,
-- valid for %(worker_seconds)s unless a heartbeat renews it (see job_heartbeat_many),
-- and, the first after the registry was lost, since when it is kept again (as there).
WITH kept AS (
    INSERT INTO {schema}.workers_kept_since AS kept (since, server_started)
    SELECT now(), pg_postmaster_start_time()
    WHERE NOT EXISTS (SELECT FROM {schema}.workers_kept_since
                      WHERE server_started = pg_postmaster_start_time())
    ON CONFLICT (one) DO UPDATE
    SET since = excluded.since, server_started = excluded.server_started
)
INSERT INTO {schema}.workers AS worker
    (id, host, pid, version, queues, tasks, concurrency, started_at, last_seen_at,
     expires_at)
VALUES (%(worker_id)s, %(worker_host)s, %(worker_pid)s, %(worker_version)s,
        %(worker_queues)s::text[], %(worker_tasks)s::text[], %(worker_concurrency)s,
        coalesce(%(worker_started_at)s, now()), now(),
        now() + make_interval(secs => %(worker_seconds)s))
ON CONFLICT (id) DO UPDATE
SET host = excluded.host, pid = excluded.pid, version = excluded.version,
    queues = excluded.queues, tasks = excluded.tasks, concurrency = excluded.concurrency,
    last_seen_at = excluded.last_seen_at, expires_at = excluded.expires_at
RETURNING started_at;

-- name: worker_deregister
-- A worker that stops cleanly leaves the registry at once.
DELETE FROM {schema}.workers WHERE id = %(worker_id)s;

-- name: workers_expired_delete
-- The rows of workers that died without saying so: they stopped counting when they
-- expired; the reaper removes them.
DELETE FROM {schema}.workers
WHERE id = ANY(ARRAY(
    SELECT id FROM {schema}.workers WHERE expires_at < now() FOR UPDATE SKIP LOCKED
));

-- name: worker_list
-- The live workers, with how many jobs each holds claimed now (running, or claimed
-- ahead and waiting for a slot), counted through the running jobs' index.
SELECT worker.id, worker.host, worker.pid, worker.version, worker.queues, worker.tasks,
       worker.concurrency, worker.started_at, worker.last_seen_at,
       coalesce(held.jobs, 0)::bigint AS running
FROM {schema}.workers AS worker
LEFT JOIN (
    SELECT worker_id, count(*) AS jobs FROM {schema}.active_jobs
    WHERE state = 'running'
    GROUP BY worker_id
) AS held ON held.worker_id = worker.id
WHERE worker.expires_at > now()
ORDER BY worker.host, worker.pid, worker.id;

-- name: workers_per_queue
-- How many live workers serve each queue.
SELECT served.queue, count(*)::bigint AS workers
FROM {schema}.workers AS worker, unnest(worker.queues) AS served (queue)
WHERE worker.expires_at > now()
GROUP BY served.queue
ORDER BY served.queue;

-- name: jobs_unserved
-- Per queue and task, the queued jobs that no live worker serves: no worker in the
-- registry whose row has not expired serves both their queue and their task (a
-- misspelt task name, a handler that was removed, a queue nobody serves). Reads the
-- queued jobs, as queue_stats does: the cost grows with the backlog, not with history.
WITH waiting AS (
    SELECT queue, task, count(*) AS jobs FROM {schema}.active_jobs
    WHERE state = 'queued'
    GROUP BY queue, task
)
SELECT queue, task, jobs::bigint AS jobs FROM waiting
WHERE NOT EXISTS (
    SELECT FROM {schema}.workers AS worker
    WHERE worker.expires_at > now()
      AND waiting.queue = ANY(worker.queues)
      AND waiting.task = ANY(worker.tasks)
)
ORDER BY queue, task;

-- name: tasks_unserved
-- Of the (queue, task) pairs given, those no live worker serves (see jobs_unserved); none
-- while the registry may still lack live workers' rows. After it was lost (a crash, a
-- failover: see workers_kept_since) or its rows expired while the server was down (a
-- clean restart), a live worker writes its row again at its next beat: within its
-- expiry, counted from the first write since. That is the longest expiry among the rows
-- there are, and at least %(registry_window)s seconds, a worker's expiry by default.
WITH registry AS (
    SELECT kept.since <= now() - make_interval(secs => greatest(
               %(registry_window)s,
               (SELECT max(date_part('epoch', worker.expires_at - worker.last_seen_at))
                FROM {schema}.workers AS worker))) AS complete
    FROM {schema}.workers_kept_since AS kept
    WHERE kept.server_started = pg_postmaster_start_time()
)
SELECT DISTINCT wanted.queue, wanted.task
FROM unnest(%(queues)s::text[], %(tasks)s::text[]) AS wanted (queue, task)
WHERE EXISTS (SELECT FROM registry WHERE complete)
  AND NOT EXISTS (
    SELECT FROM {schema}.workers AS worker
    WHERE worker.expires_at > now()
      AND wanted.queue = ANY(worker.queues)
      AND wanted.task = ANY(worker.tasks)
)
ORDER BY wanted.queue, wanted.task;
