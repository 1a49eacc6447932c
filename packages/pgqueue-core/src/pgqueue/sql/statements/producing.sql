-- Producing: inserting jobs, one, many, by COPY, and with idempotency or unique keys.
-- Placeholders and parameters: see pgqueue/queries.py.

-- name: job_insert
-- One job without an idempotency key: what an application enqueues once per request,
-- kept to one plain INSERT. Only what the server decided comes back (the id and the
-- times): the caller knows the rest, and every column returned costs a conversion.
-- The last column wakes the workers waiting on the job's queue (see queue_waiters in
-- schema.sql): one notification, naming the queue, never a payload, sent when the
-- transaction commits, and only while a worker waits. Its subquery names no column of
-- the new row, so it runs once, beside the INSERT: a CTE around the INSERT to read
-- the queue back cost this statement a third more server time.
INSERT INTO {schema}.active_jobs
    (queue, task, payload, priority, run_at, max_attempts, timeout_seconds, trace_context,
     tags, partition_key)
VALUES (%(queue)s, %(task)s, %(payload)s, %(priority)s,
        COALESCE(%(run_at)s, now() + make_interval(secs => %(delay_seconds)s)),
        %(max_attempts)s, %(timeout_seconds)s, %(trace_context)s,
        %(tags)s::text[], %(partition_key)s::text)
RETURNING id, run_at, enqueued_at, (
    SELECT pg_notify({channel_name}, waiter.queue)
    FROM {schema}.queue_waiters AS waiter
    WHERE waiter.queue = %(queue)s AND waiter.expires_at > now()
    LIMIT 1
) IS NOT NULL AS woke_a_worker;

-- name: job_insert_many
-- Jobs without idempotency keys (the common case: no key to take first). Rows go in
-- in request order, so ids follow it. Each job's tags come as a JSON array (NULL for
-- none): an array of arrays must be rectangular, and one job's tags are not another's.
-- As job_insert, only what the server decided comes back: the caller knows the rest,
-- and a payload sent back would be sent, and decoded, twice.
WITH inserted AS (
    INSERT INTO {schema}.active_jobs
        (queue, task, payload, priority, run_at, max_attempts, timeout_seconds,
         trace_context, tags, partition_key)
    SELECT queue, task, payload, priority,
           COALESCE(run_at, now() + make_interval(secs => delay_seconds)),
           max_attempts, timeout_seconds, trace_context,
           CASE WHEN tags IS NOT NULL THEN ARRAY(SELECT jsonb_array_elements_text(tags)) END,
           partition_key
    FROM unnest(
        %(queue)s::text[], %(task)s::text[], %(payload)s::jsonb[], %(priority)s::smallint[],
        %(run_at)s::timestamptz[], %(delay_seconds)s::float8[], %(max_attempts)s::int[],
        %(timeout_seconds)s::float8[], %(trace_context)s::jsonb[], %(tags_json)s::jsonb[],
        %(partition_key)s::text[]
    ) WITH ORDINALITY AS item (queue, task, payload, priority, run_at, delay_seconds,
                               max_attempts, timeout_seconds, trace_context, tags,
                               partition_key, position)
    ORDER BY position
    RETURNING id, run_at, enqueued_at, queue
),
woken AS (
    -- Wakes the workers waiting on these queues (see queue_waiters in schema.sql): one
    -- notification per queue with a live waiter, naming the queue, never a payload,
    -- sent when the transaction commits. Read once, by the subquery below.
    SELECT pg_notify({channel_name}, wanted.queue)
    FROM (SELECT DISTINCT queue FROM inserted) AS wanted
    WHERE EXISTS (
        SELECT FROM {schema}.queue_waiters AS waiter
        WHERE waiter.queue = wanted.queue AND waiter.expires_at > now()
    )
)
SELECT id, run_at, enqueued_at FROM inserted WHERE (SELECT count(*) FROM woken) >= 0;

-- name: job_ids_reserve
-- The first step of adding a large keyless batch by COPY (see pgqueue/bulk.py): the
-- batch's ids, in order, and the transaction's clock, from which its run_at values are
-- computed and which its enqueued_at defaults to.
SELECT now() AS now,
       array(SELECT nextval('{schema}.job_ids') FROM generate_series(1, %(count)s)) AS ids;

-- name: job_copy
COPY {schema}.active_jobs
    (id, queue, task, payload, priority, run_at, max_attempts, timeout_seconds,
     trace_context, tags, partition_key)
FROM STDIN;

-- name: job_copy_runnable_now
-- job_copy for a batch of which no job has a delay or a run_at: run_at is left to its
-- default, now(), the transaction's clock that job_ids_reserve read. A timestamp is the
-- dearest column of a row to format and to parse.
COPY {schema}.active_jobs
    (id, queue, task, payload, priority, max_attempts, timeout_seconds, trace_context,
     tags, partition_key)
FROM STDIN;

-- name: queues_wake
-- After a COPY: wakes the workers waiting on these queues, as the INSERT statements'
-- woken CTE does, when the transaction commits.
SELECT count(pg_notify({channel_name}, wanted.queue))
FROM unnest(%(queues)s::text[]) AS wanted (queue)
WHERE EXISTS (
    SELECT FROM {schema}.queue_waiters AS waiter
    WHERE waiter.queue = wanted.queue AND waiter.expires_at > now()
);

-- name: job_insert_many_keyed
-- Jobs of which some carry an idempotency key or a unique key (see pgqueue/keyed.py):
-- each idempotency key is taken in idempotency_keys for the id its job will have, and
-- only the jobs whose key was free (or that have none) are inserted. A key already
-- taken, by a job in the table or by an earlier item of the same statement, inserts
-- nothing for its item. A key another transaction is taking right now waits for that
-- transaction, then counts as taken if it committed. Then a unique key held by a
-- queued or running job (or an earlier item, or another transaction that commits it)
-- inserts nothing either (active_jobs_unique_key_idx); an idempotency key taken for
-- such an item is left without its job, for the caller to free in the same transaction
-- (idempotency_keys_release). One row per item, in order: its position (from 1), the
-- id reserved for it, whether it took its idempotency key, and its job's columns if it
-- was inserted (all NULL if not).
WITH item AS (
    SELECT nextval('{schema}.job_ids') AS id, item.*
    FROM unnest(
        %(queue)s::text[], %(task)s::text[], %(payload)s::jsonb[], %(priority)s::smallint[],
        %(run_at)s::timestamptz[], %(delay_seconds)s::float8[], %(max_attempts)s::int[],
        %(timeout_seconds)s::float8[], %(idempotency_key)s::text[],
        %(trace_context)s::jsonb[], %(unique_key)s::text[], %(pending_dependencies)s::int[],
        %(tags_json)s::jsonb[], %(partition_key)s::text[]
    ) WITH ORDINALITY AS item (queue, task, payload, priority, run_at, delay_seconds,
                               max_attempts, timeout_seconds, idempotency_key,
                               trace_context, unique_key, pending_dependencies, tags,
                               partition_key, position)
),
taken AS (
    INSERT INTO {schema}.idempotency_keys (key, job_id)
    SELECT idempotency_key, id FROM item
    WHERE idempotency_key IS NOT NULL
    ORDER BY position
    ON CONFLICT (key) DO NOTHING
    RETURNING job_id
),
inserted AS (
    INSERT INTO {schema}.active_jobs
        (id, queue, task, payload, priority, state, run_at, max_attempts, timeout_seconds,
         idempotency_key, trace_context, unique_key, pending_dependencies, tags,
         partition_key)
    SELECT id, queue, task, payload, priority,
           -- A job with dependencies still to succeed waits (see pgqueue.dependencies).
           CASE WHEN pending_dependencies > 0 THEN 'waiting' ELSE 'queued' END::{schema}.job_state,
           COALESCE(run_at, now() + make_interval(secs => delay_seconds)),
           max_attempts, timeout_seconds, idempotency_key, trace_context, unique_key,
           pending_dependencies,
           CASE WHEN tags IS NOT NULL THEN ARRAY(SELECT jsonb_array_elements_text(tags)) END,
           partition_key
    FROM item
    WHERE idempotency_key IS NULL OR id IN (SELECT job_id FROM taken)
    ORDER BY position
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING
    RETURNING *
),
woken AS (
    -- Wakes the workers waiting on these queues (see queue_waiters in schema.sql): one
    -- notification per queue with a live waiter, naming the queue, never a payload,
    -- sent when the transaction commits. Read once, by the subquery below. A waiting
    -- job wakes nobody: the ack that queues it does.
    SELECT pg_notify({channel_name}, wanted.queue)
    FROM (SELECT DISTINCT queue FROM inserted WHERE state = 'queued') AS wanted
    WHERE EXISTS (
        SELECT FROM {schema}.queue_waiters AS waiter
        WHERE waiter.queue = wanted.queue AND waiter.expires_at > now()
    )
)
SELECT item.position, item.id AS reserved_id,
       item.id IN (SELECT job_id FROM taken) AS took_key, inserted.*
FROM item LEFT JOIN inserted ON inserted.id = item.id
WHERE (SELECT count(*) FROM woken) >= 0
ORDER BY item.position;

-- name: idempotency_keys_release
-- Frees the idempotency keys that job_insert_many_keyed took for items it did not
-- insert because their unique key was held, before the transaction commits: an
-- idempotency key stays only with a job its enqueue created.
DELETE FROM {schema}.idempotency_keys AS taken
USING unnest(%(keys)s::text[], %(ids)s::bigint[]) AS gone (key, job_id)
WHERE taken.key = gone.key AND taken.job_id = gone.job_id;

-- name: job_get_many_by_unique_key
-- The queued and running jobs holding these unique keys (finished jobs hold none),
-- through active_jobs_unique_key_idx.
SELECT * FROM {schema}.active_jobs WHERE unique_key = ANY(%(unique_keys)s::text[]);

-- name: job_get_many_by_idempotency_key
-- For each item whose key was taken (by an earlier item of the same insert, or by a job
-- already in the table), the job holding the key and which of task, queue and payload
-- differ from the item's. Payloads are compared as jsonb, so key order, white space and
-- the spelling of numbers do not count as differences. One row per item found, with its
-- position, counted from 1, in the arrays given.
SELECT job.*, item.position,
       array_remove(ARRAY[
           CASE WHEN job.task <> item.task THEN 'task' END,
           CASE WHEN job.queue <> item.queue THEN 'queue' END,
           CASE WHEN job.payload <> item.payload THEN 'payload' END
       ], NULL) AS differs
FROM unnest(%(idempotency_keys)s::text[], %(tasks)s::text[], %(queues)s::text[],
            %(payloads)s::jsonb[])
     WITH ORDINALITY AS item (key, task, queue, payload, position)
JOIN {schema}.idempotency_keys AS taken ON taken.key = item.key
JOIN {schema}.jobs AS job ON job.id = taken.job_id;

-- name: job_delete_created
-- Takes back jobs that the caller's own transaction has just inserted (an enqueue_many
-- refused for an idempotency conflict), and their keys, so that the caller may still
-- commit the rest of its work without them. Nobody else has seen them: they are not
-- committed.
WITH gone AS (
    DELETE FROM {schema}.active_jobs WHERE id = ANY(%(ids)s::bigint[])
    RETURNING id, idempotency_key
)
DELETE FROM {schema}.idempotency_keys AS taken
USING gone
WHERE taken.key = gone.idempotency_key AND taken.job_id = gone.id;
