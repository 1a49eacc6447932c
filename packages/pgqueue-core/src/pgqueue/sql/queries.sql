-- Every statement pgqueue runs, named Entity+Verb. Each state transition is one
-- statement, guarded by the state it leaves (and by the lease token where a worker
-- holds the job), and reads only the database clock.
--
-- Placeholders: {schema} is the quoted schema name, {lock} the row-lock clause of a
-- claim, {channel} the schema's notification channel; the few statements that name a
-- partition, a filter or a bound have their own, filled by queries.compose. Parameters
-- use psycopg's %(name)s style.

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
    RETURNING *
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
SELECT * FROM inserted WHERE (SELECT count(*) FROM woken) >= 0;

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

-- name: job_claim_plan
-- Run first in a claim's transaction: job_claim and job_claim_limited run with their
-- prepared statement's generic plan, and without JIT, until the claim commits.
-- Their plans do not depend on their parameters: each queue and task's candidates come
-- from one scan of active_jobs_claim_idx in its order, stopped after the claim's LIMIT,
-- whatever its value. But a generic plan prices a LIMIT parameter as a tenth of the table, so by
-- default PostgreSQL keeps choosing a custom plan and plans the claim anew at every
-- call, which on a busy queue is a large share of the claim's time on the server. That
-- pricing would also turn JIT on for a long backlog, compiling the claim at every call
-- for nothing: it reads a handful of rows. Local to the transaction, so a pooled
-- connection (or PgBouncer's server connection) keeps its own settings for everything
-- else; with prepared statements turned off, every plan is a custom one anyway.
SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('jit', 'off', true);

-- name: job_claim
-- queued -> running for up to %(limit)s runnable jobs in claim order. Each claim is a
-- new attempt with a fresh lease token. For queues without settings (see
-- queue_settings), the common case: a queue that has some gives no job here, and
-- job_claim_times, run next, says so, for the caller to claim it with
-- job_claim_limited from then on (WorkerProtocol.claim does). A pause therefore holds from the
-- first claim after it commits, whichever statement a worker was using.
-- Jobs without a partition key only: a queue with queued jobs that have one gives no
-- job here either, and is claimed with job_claim_limited, as a queue with settings is.
-- The candidates come from index scans of active_jobs_claim_idx, one per queue and task
-- (a source), each in claim order and stopped after the rows it gives, so a claim reads
-- a handful of index entries however long the backlog, of its tasks or of any other
-- (a single scan over queue = ANY(...) or task = ANY(...) cannot use the index order,
-- and would read every queued row of the queue). A source with no runnable job costs
-- one probe (sources). Each source locks only its share of the claim (shares): all of
-- it when one source has runnable jobs, the common case; else the number of its jobs
-- among the best %(limit)s of the sources' first %(limit)s each, read without locks.
-- Jobs that another claim holds are skipped (SKIP LOCKED) and the source's next ones
-- taken; should a source run out that way (fewer taken than the shares), the sources'
-- next jobs make up the claim (more), so that a claim comes back short only when there
-- are no more jobs to claim. The best %(limit)s candidates are claimed, in claim order.
-- With a %(waiter)s (a worker that LISTENs), the claim also says whether that worker
-- will wait: its rows in queue_waiters are replaced by one per queue, valid for
-- %(waiter_seconds)s, when the claim came back short, and removed when it came back
-- full. Neither ever waits for a lock: the old rows are taken with SKIP LOCKED, and
-- the table has no unique key for a new row to wait on (a claim cut off mid-statement
-- may leave a transaction holding rows until the server notices; its rows then only
-- expire).
WITH sources AS MATERIALIZED (
    SELECT wanted.queue, served.task
    FROM unnest(%(queues)s::text[]) AS wanted (queue)
    CROSS JOIN unnest(%(tasks)s::text[]) AS served (task)
    -- A probe in claim order: an index scan stopped at its first row (an EXISTS could be
    -- planned as a sequential scan, which reads the whole table for a task with no job).
    LEFT JOIN LATERAL (
        SELECT true AS runnable FROM {schema}.active_jobs
        WHERE state = 'queued'
          AND queue = wanted.queue
          AND task = served.task
          AND run_at <= now()
          AND partition_key IS NULL
        ORDER BY priority DESC, run_at, id
        LIMIT 1
    ) AS probe ON cardinality(%(queues)s::text[]) * cardinality(%(tasks)s::text[]) > 1
    WHERE NOT EXISTS (SELECT FROM {schema}.queue_settings AS setting
                      WHERE setting.queue = wanted.queue)
      -- A queue with queued jobs that have a partition key is claimed by
      -- job_claim_limited, which shares it fairly between the keys: one probe of
      -- active_jobs_partition_claim_idx, which is empty for a queue without keys.
      AND NOT EXISTS (SELECT FROM {schema}.active_jobs AS keyed
                      WHERE keyed.state = 'queued' AND keyed.queue = wanted.queue
                        AND keyed.partition_key IS NOT NULL)
      AND (cardinality(%(queues)s::text[]) * cardinality(%(tasks)s::text[]) = 1
           OR probe.runnable)
),
shares AS (
    SELECT queue, task, %(limit)s::int AS jobs FROM sources
    WHERE (SELECT count(*) FROM sources) = 1
    UNION ALL
    SELECT best.queue, best.task, count(*)::int AS jobs
    FROM (
        SELECT sources.queue, sources.task
        FROM sources
        CROSS JOIN LATERAL (
            SELECT id, priority, run_at FROM {schema}.active_jobs
            WHERE state = 'queued'
              AND queue = sources.queue
              AND task = sources.task
              AND run_at <= now()
          AND partition_key IS NULL
            ORDER BY priority DESC, run_at, id
            LIMIT %(limit)s
        ) AS head
        ORDER BY head.priority DESC, head.run_at, head.id
        LIMIT %(limit)s
    ) AS best
    WHERE (SELECT count(*) FROM sources) > 1
    GROUP BY best.queue, best.task
),
taken AS (
    SELECT candidate.id, candidate.priority, candidate.run_at
    FROM shares
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM {schema}.active_jobs
        WHERE state = 'queued'
          AND queue = shares.queue
          AND task = shares.task
          AND run_at <= now()
          AND partition_key IS NULL
        ORDER BY priority DESC, run_at, id
        LIMIT shares.jobs
        {lock}
    ) AS candidate
),
more AS (
    SELECT candidate.id, candidate.priority, candidate.run_at
    FROM sources
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM {schema}.active_jobs
        WHERE state = 'queued'
          AND queue = sources.queue
          AND task = sources.task
          AND run_at <= now()
          AND partition_key IS NULL
          AND id <> ALL(ARRAY(SELECT id FROM taken))
        ORDER BY priority DESC, run_at, id
        LIMIT %(limit)s - (SELECT count(*) FROM taken)
        {lock}
    ) AS candidate
    WHERE (SELECT count(*) FROM sources) > 1
      AND (SELECT count(*) FROM taken) < (SELECT sum(jobs) FROM shares)
),
claimable AS (
    SELECT candidate.id
    FROM (SELECT * FROM taken UNION ALL SELECT * FROM more) AS candidate
    ORDER BY candidate.priority DESC, candidate.run_at, candidate.id
    LIMIT %(limit)s
),
claimed AS (
UPDATE {schema}.active_jobs AS job
SET state = 'running',
    -- Saturating: a row written around pgqueue with attempts at the integer limit
    -- still runs (and goes dead if it fails) instead of failing every claim of its
    -- queue with "integer out of range".
    attempts = least(job.attempts, 2147483646) + 1,
    lease_token = gen_random_uuid(),
    lease_expires_at = (SELECT {schema}.claim_clock()) + make_interval(secs => %(lease_seconds)s),
    worker_id = %(worker_id)s,
    started_at = (SELECT {schema}.claim_clock())
-- By primary key, one row at a time: a join to the claimed ids lets the planner hash
-- them and scan the whole table, which grows with the history the table holds.
WHERE job.id = ANY(ARRAY(SELECT id FROM claimable))
-- Every column that differs between the claimed rows, in the order of pgqueue.Job's
-- fields, the payload as text: the worker loads a whole claim's payloads with one JSON
-- parse, instead of one per row through the driver. The columns this statement sets
-- alike for every row (state, worker_id, started_at, lease_expires_at) come once, from
-- job_claim_times in the same transaction: a claim returns hundreds of rows, and each
-- timestamp costs the server and the client a conversion per row.
RETURNING job.id, job.queue, job.task, job.payload::text AS payload, job.priority,
          job.run_at, job.attempts, job.max_attempts, job.timeout_seconds,
          job.lease_token, job.enqueued_at, job.finished_at, job.last_error, job.errors,
          job.result, job.idempotency_key, job.trace_context, job.unique_key,
          job.tags, job.progress, job.partition_key,
          -- Not a field of Job, after them: NULL for a job enqueued without
          -- dependencies, so the worker reads the dependencies of the others alone
          -- (job_dependencies_of_many).
          job.pending_dependencies
),
no_longer_waiting AS (
    DELETE FROM {schema}.queue_waiters
    WHERE %(waiter)s::text IS NOT NULL
      AND ctid = ANY(ARRAY(
          SELECT ctid FROM {schema}.queue_waiters
          WHERE waiter = %(waiter)s
          FOR UPDATE SKIP LOCKED
      ))
),
waiting AS (
    INSERT INTO {schema}.queue_waiters (queue, waiter, expires_at)
    SELECT wanted.queue, %(waiter)s, now() + make_interval(secs => %(waiter_seconds)s)
    FROM unnest(%(queues)s::text[]) AS wanted (queue)
    WHERE %(waiter)s::text IS NOT NULL
      AND (SELECT count(*) FROM claimed) < %(limit)s
)
SELECT * FROM claimed;

-- name: job_claim_limited
-- job_claim for queues that have settings (paused, throttled, or a concurrency or rate
-- limit of the queue or of its partition keys) or queued jobs with a partition key:
-- queued -> running for up to %(limit)s runnable jobs in claim order, as they allow.
--
-- Claim order (docs/operating-queues.md): priority first. Within one priority, the
-- jobs are taken round-robin across lanes, one job per lane per round: each partition
-- key of a (queue, task) is a lane, and its jobs without a key are one more, served
-- first in each round. The keys follow each other in text order starting after the key
-- that the queue's previous claim served last (fair_share_cursors), wrapping around,
-- so the key served least recently comes first. Within a lane, run_at, then id.
--
-- The keys come from a loose index scan of active_jobs_partition_claim_idx, one descent
-- per key, up to %(limit)s keys that have room (a key throttled, at its concurrency
-- limit or out of tokens is passed over, and the walk goes on to the next), and at most
-- 8 times that many keys in all. Each lane then gives its share of the claim, read in
-- claim order from its index range: a claim reads a few index entries per job, however
-- long the backlog and however many keys it holds. A lane that has fewer jobs than its
-- share leaves the claim short; the next claim, in a moment, takes the rest.
--
-- Jobs that another claim holds are skipped (SKIP LOCKED) and the lane's next ones
-- taken. No queue gives more than its room, and no key more than its own (ranked,
-- after the lanes' shares are read).
-- With a %(waiter)s (a worker that LISTENs), the claim also says whether that worker
-- will wait: its rows in queue_waiters are replaced by one per queue, valid for
-- %(waiter_seconds)s, when the claim came back short, and removed when it came back
-- full. Neither ever waits for a lock: the old rows are taken with SKIP LOCKED, and
-- the table has no unique key for a new row to wait on (a claim cut off mid-statement
-- may leave a transaction holding rows until the server notices; its rows then only
-- expire).
-- Operator settings (queue_settings) are read here, at every claim: a paused or
-- throttled queue gives no job, a limited one at most what its concurrency limit and
-- its token bucket leave room for. Claims of a limited queue (by the queue or per key)
-- take turns on its row (job_claim_lock, run just before in the same transaction), so
-- each one's snapshot holds the running jobs of the claim before it, and the buckets
-- it spent. A limited queue whose row that statement did not lock (its limit was set
-- in between, or it was not run) gives no job this time: counted without the lock, its
-- room could be counted twice.
WITH room AS MATERIALIZED (
    SELECT wanted.queue,
           coalesce(setting.paused, false) AS paused,
           CASE
               WHEN setting.queue IS NULL THEN %(limit)s::int
               WHEN setting.paused THEN 0
               WHEN setting.throttled_until > clock_timestamp() THEN 0
               WHEN (setting.concurrency_limit IS NOT NULL OR setting.rate_limit IS NOT NULL
                     OR setting.partition_concurrency_limit IS NOT NULL
                     OR setting.partition_rate_limit IS NOT NULL)
                    AND NOT setting.queue = ANY(coalesce(
                        nullif(current_setting('pgqueue.claim_locked', true), '')::text[],
                        ARRAY[]::text[]))
                   THEN 0
               ELSE least(
                   %(limit)s::int,
                   -- Counted only for a queue with a concurrency limit, through the
                   -- running jobs' index, by queue.
                   CASE WHEN setting.concurrency_limit IS NOT NULL THEN greatest(0,
                       setting.concurrency_limit - (
                           SELECT count(*) FROM {schema}.active_jobs AS job
                           WHERE job.state = 'running' AND job.queue = wanted.queue))::int
                   END,
                   floor(bucket.tokens)::int)
           END AS jobs,
           bucket.tokens,
           bucket.at,
           setting.partition_concurrency_limit AS key_limit,
           setting.partition_rate_limit AS key_rate,
           turn.partition_key AS turn_after
    FROM unnest(%(queues)s::text[]) AS wanted (queue)
    LEFT JOIN {schema}.queue_settings AS setting ON setting.queue = wanted.queue
    LEFT JOIN {schema}.fair_share_cursors AS turn ON turn.queue = wanted.queue
    -- The rate limit's bucket, refilled for the time since it was last spent, on the
    -- clock rather than now(): this transaction may have waited for the row's lock.
    LEFT JOIN LATERAL (
        SELECT clock.at,
               least(greatest(1, setting.rate_limit / 10),
                     setting.tokens + setting.rate_limit
                         * greatest(0, extract(epoch FROM clock.at - setting.tokens_at)))
                   AS tokens
        FROM (SELECT clock_timestamp() AS at) AS clock
        WHERE setting.rate_limit IS NOT NULL
    ) AS bucket ON true
),
sources AS MATERIALIZED (
    SELECT room.queue, served.task, room.jobs AS room, room.key_limit, room.key_rate,
           room.turn_after,
           -- Whether a key's room needs asking (partition_room): not for a queue
           -- without partition limits whose keys have no controls (no throttle), the
           -- fair share alone.
           room.key_limit IS NOT NULL OR room.key_rate IS NOT NULL
           OR EXISTS (SELECT FROM {schema}.partition_controls AS control
                      WHERE control.queue = room.queue) AS keys_controlled
    FROM room
    CROSS JOIN unnest(%(tasks)s::text[]) AS served (task)
    WHERE room.jobs > 0
),
keys AS MATERIALIZED (
    -- Each source's partition keys that have room, in turn order: first the keys after
    -- the queue's turn, then from the first key up to it (wrapped). Each step of the
    -- walk is one descent of active_jobs_partition_claim_idx to the next key with queued
    -- jobs, and partition_room() says how many jobs of that key may start now. The walk
    -- stops once it has found %(limit)s keys with room, or has walked 8 times that many.
    SELECT sources.queue, sources.task, walked.partition_key, walked.room, walked.tokens,
           walked.place
    FROM sources
    CROSS JOIN LATERAL (
        WITH RECURSIVE walk (partition_key, wrapped, place, opened, room, tokens) AS (
            SELECT first.partition_key, first.wrapped, 1, (key_room.room > 0)::int,
                   key_room.room, key_room.tokens
            FROM (
                SELECT found.partition_key, found.wrapped
                FROM (
                    (SELECT job.partition_key, false AS wrapped
                     FROM {schema}.active_jobs AS job
                     WHERE job.state = 'queued' AND job.queue = sources.queue
                       AND job.task = sources.task AND job.partition_key IS NOT NULL
                       AND job.partition_key > coalesce(sources.turn_after, '')
                     ORDER BY job.partition_key LIMIT 1)
                    UNION ALL
                    (SELECT job.partition_key, true AS wrapped
                     FROM {schema}.active_jobs AS job
                     WHERE job.state = 'queued' AND job.queue = sources.queue
                       AND job.task = sources.task AND job.partition_key IS NOT NULL
                       AND job.partition_key <= sources.turn_after
                     ORDER BY job.partition_key LIMIT 1)
                ) AS found
                ORDER BY found.wrapped LIMIT 1
            ) AS first
            CROSS JOIN LATERAL (
                SELECT * FROM {schema}.partition_room(
                    sources.queue, first.partition_key, sources.key_limit, sources.key_rate,
                    %(limit)s)
                WHERE sources.keys_controlled
                UNION ALL
                SELECT %(limit)s::int, NULL::float8 WHERE NOT sources.keys_controlled
            ) AS key_room
            UNION ALL
            SELECT next.partition_key, next.wrapped, walk.place + 1,
                   walk.opened + (key_room.room > 0)::int, key_room.room, key_room.tokens
            FROM walk
            CROSS JOIN LATERAL (
                SELECT found.partition_key, found.wrapped
                FROM (
                    (SELECT job.partition_key, walk.wrapped AS wrapped
                     FROM {schema}.active_jobs AS job
                     WHERE job.state = 'queued' AND job.queue = sources.queue
                       AND job.task = sources.task AND job.partition_key IS NOT NULL
                       AND job.partition_key > walk.partition_key
                       AND (NOT walk.wrapped OR job.partition_key <= sources.turn_after)
                     ORDER BY job.partition_key LIMIT 1)
                    UNION ALL
                    (SELECT job.partition_key, true AS wrapped
                     FROM {schema}.active_jobs AS job
                     WHERE job.state = 'queued' AND job.queue = sources.queue
                       AND job.task = sources.task AND job.partition_key IS NOT NULL
                       AND NOT walk.wrapped
                       AND job.partition_key <= sources.turn_after
                     ORDER BY job.partition_key LIMIT 1)
                ) AS found
                ORDER BY found.wrapped LIMIT 1
            ) AS next
            CROSS JOIN LATERAL (
                SELECT * FROM {schema}.partition_room(
                    sources.queue, next.partition_key, sources.key_limit, sources.key_rate,
                    %(limit)s)
                WHERE sources.keys_controlled
                UNION ALL
                SELECT %(limit)s::int, NULL::float8 WHERE NOT sources.keys_controlled
            ) AS key_room
            WHERE walk.place < 8 * %(limit)s AND walk.opened < %(limit)s
        )
        SELECT walk.partition_key, walk.room, walk.tokens, walk.place
        FROM walk
        WHERE walk.room > 0
    ) AS walked
),
lanes AS MATERIALIZED (
    -- The keys with room, and each source's jobs without a key (lane place 0, first in
    -- every round) when it has one runnable: a probe of active_jobs_claim_idx.
    SELECT queue, task, partition_key, room, place FROM keys
    UNION ALL
    SELECT sources.queue, sources.task, NULL, sources.room, 0
    FROM sources
    WHERE EXISTS (SELECT FROM {schema}.active_jobs
                  WHERE state = 'queued'
                    AND queue = sources.queue
                    AND task = sources.task
                    AND run_at <= now()
                    AND partition_key IS NULL)
),
shared AS (
    -- Each lane's share of the claim, its first jobs in claim order: the claim split
    -- evenly between the lanes, at most the lane's room. A lane of a key reads its
    -- range of active_jobs_partition_claim_idx, the lane without a key its range of
    -- active_jobs_claim_idx.
    SELECT lanes.queue, lanes.task, lanes.partition_key, lanes.place, lanes.room,
           least(lanes.room, ceil(%(limit)s::numeric / (SELECT count(*) FROM lanes))::int)
               AS share
    FROM lanes
),
taken AS (
    SELECT shared.queue, shared.task, shared.partition_key, shared.place,
           shared.room AS lane_room, candidate.id, candidate.priority, candidate.run_at
    FROM shared
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM {schema}.active_jobs
        WHERE state = 'queued'
          AND queue = shared.queue
          AND task = shared.task
          AND partition_key = shared.partition_key
          AND run_at <= now()
        ORDER BY priority DESC, run_at, id
        LIMIT shared.share
        {lock}
    ) AS candidate
    WHERE shared.partition_key IS NOT NULL
    UNION ALL
    SELECT shared.queue, shared.task, NULL, shared.place, shared.room, candidate.id,
           candidate.priority, candidate.run_at
    FROM shared
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM {schema}.active_jobs
        WHERE state = 'queued'
          AND queue = shared.queue
          AND task = shared.task
          AND partition_key IS NULL
          AND run_at <= now()
        ORDER BY priority DESC, run_at, id
        LIMIT shared.share
        {lock}
    ) AS candidate
    WHERE shared.partition_key IS NULL
),
more AS (
    -- When the shares came back short (another claim holds some of their jobs, or a
    -- lane has fewer jobs than its share), the lanes' next jobs make up the claim, so
    -- that a claim comes back short only when there are no more jobs it may take.
    SELECT shared.queue, shared.task, shared.partition_key, shared.place,
           shared.room AS lane_room, candidate.id, candidate.priority, candidate.run_at
    FROM shared
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM {schema}.active_jobs
        WHERE state = 'queued'
          AND queue = shared.queue
          AND task = shared.task
          AND partition_key = shared.partition_key
          AND run_at <= now()
          AND id <> ALL(ARRAY(SELECT id FROM taken))
        ORDER BY priority DESC, run_at, id
        LIMIT greatest(0, least(shared.room, %(limit)s - (SELECT count(*) FROM taken)))
        {lock}
    ) AS candidate
    WHERE shared.partition_key IS NOT NULL
      AND (SELECT count(*) FROM taken) < (SELECT sum(share) FROM shared)
    UNION ALL
    SELECT shared.queue, shared.task, NULL, shared.place, shared.room, candidate.id,
           candidate.priority, candidate.run_at
    FROM shared
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM {schema}.active_jobs
        WHERE state = 'queued'
          AND queue = shared.queue
          AND task = shared.task
          AND partition_key IS NULL
          AND run_at <= now()
          AND id <> ALL(ARRAY(SELECT id FROM taken))
        ORDER BY priority DESC, run_at, id
        LIMIT greatest(0, least(shared.room, %(limit)s - (SELECT count(*) FROM taken)))
        {lock}
    ) AS candidate
    WHERE shared.partition_key IS NULL
      AND (SELECT count(*) FROM taken) < (SELECT sum(share) FROM shared)
),
rounds AS (
    -- The round of a job is its place among its lane's jobs of the same priority.
    SELECT candidate.*,
           row_number() OVER (PARTITION BY candidate.queue, candidate.task,
                                           candidate.partition_key, candidate.priority
                              ORDER BY candidate.run_at, candidate.id) AS round
    FROM (SELECT * FROM taken UNION ALL SELECT * FROM more) AS candidate
),
claimable AS (
    -- In claim order, no queue beyond its room and no key beyond its own.
    SELECT ranked.id, ranked.queue, ranked.partition_key,
           row_number() OVER (ORDER BY ranked.priority DESC, ranked.round, ranked.place,
                                       ranked.run_at, ranked.id) AS position
    FROM (
        SELECT rounds.*, room.jobs AS queue_room,
               row_number() OVER (PARTITION BY rounds.queue
                                  ORDER BY rounds.priority DESC, rounds.round, rounds.place,
                                           rounds.run_at, rounds.id) AS in_queue,
               row_number() OVER (PARTITION BY rounds.queue, rounds.partition_key
                                  ORDER BY rounds.priority DESC, rounds.round, rounds.place,
                                           rounds.run_at, rounds.id) AS in_lane
        FROM rounds
        JOIN room ON room.queue = rounds.queue
    ) AS ranked
    WHERE ranked.in_queue <= ranked.queue_room
      AND (ranked.partition_key IS NULL OR ranked.in_lane <= ranked.lane_room)
    ORDER BY ranked.priority DESC, ranked.round, ranked.place, ranked.run_at, ranked.id
    LIMIT %(limit)s
),
claimed AS (
UPDATE {schema}.active_jobs AS job
SET state = 'running',
    -- Saturating: a row written around pgqueue with attempts at the integer limit
    -- still runs (and goes dead if it fails) instead of failing every claim of its
    -- queue with "integer out of range".
    attempts = least(job.attempts, 2147483646) + 1,
    lease_token = gen_random_uuid(),
    lease_expires_at = (SELECT {schema}.claim_clock()) + make_interval(secs => %(lease_seconds)s),
    worker_id = %(worker_id)s,
    started_at = (SELECT {schema}.claim_clock())
-- By primary key, one row at a time: a join to the claimed ids lets the planner hash
-- them and scan the whole table, which grows with the history the table holds.
WHERE job.id = ANY(ARRAY(SELECT id FROM claimable))
-- As in job_claim.
RETURNING job.id, job.queue, job.task, job.payload::text AS payload, job.priority,
          job.run_at, job.attempts, job.max_attempts, job.timeout_seconds,
          job.lease_token, job.enqueued_at, job.finished_at, job.last_error, job.errors,
          job.result, job.idempotency_key, job.trace_context, job.unique_key,
          job.tags, job.progress, job.partition_key,
          job.pending_dependencies
),
no_longer_waiting AS (
    DELETE FROM {schema}.queue_waiters
    WHERE %(waiter)s::text IS NOT NULL
      AND ctid = ANY(ARRAY(
          SELECT ctid FROM {schema}.queue_waiters
          WHERE waiter = %(waiter)s
          FOR UPDATE SKIP LOCKED
      ))
),
waiting AS (
    -- Not on a paused queue: its enqueues need wake nobody (resuming it does, see
    -- queue_update).
    INSERT INTO {schema}.queue_waiters (queue, waiter, expires_at)
    SELECT room.queue, %(waiter)s, now() + make_interval(secs => %(waiter_seconds)s)
    FROM room
    WHERE %(waiter)s::text IS NOT NULL
      AND NOT room.paused
      AND (SELECT count(*) FROM claimed) < %(limit)s
),
spent AS (
    -- The rate-limited queues' buckets, less the jobs claimed from them.
    UPDATE {schema}.queue_settings AS setting
    SET tokens = room.tokens - (SELECT count(*) FROM claimed WHERE claimed.queue = room.queue),
        tokens_at = room.at
    FROM room
    WHERE setting.queue = room.queue AND room.tokens IS NOT NULL
),
keys_spent AS (
    -- The buckets of the keys claimed from under a partition_rate_limit, less the jobs
    -- claimed (this claim holds the queue's row: no other claim spends them meanwhile).
    INSERT INTO {schema}.partition_controls AS control
        (queue, partition_key, tokens, tokens_at)
    SELECT used.queue, used.partition_key, used.tokens - used.jobs, clock_timestamp()
    FROM (
        SELECT claimed.queue, claimed.partition_key, count(*) AS jobs,
               (SELECT max(keys.tokens) FROM keys
                WHERE keys.queue = claimed.queue
                  AND keys.partition_key = claimed.partition_key) AS tokens
        FROM claimed
        WHERE claimed.partition_key IS NOT NULL
        GROUP BY claimed.queue, claimed.partition_key
    ) AS used
    WHERE used.tokens IS NOT NULL
    ORDER BY used.queue, used.partition_key
    ON CONFLICT (queue, partition_key) DO UPDATE
    SET tokens = excluded.tokens, tokens_at = excluded.tokens_at
),
served_last AS (
    -- Per queue, the key of the last job with a key in this claim's order.
    SELECT DISTINCT ON (claimable.queue) claimable.queue, claimable.partition_key
    FROM claimable
    WHERE claimable.partition_key IS NOT NULL
    ORDER BY claimable.queue, claimable.position DESC
),
turned AS (
    -- The queue's turn moves on to that key, unless another claim holds its row right
    -- now: that claim moves it. A claim never waits for it.
    UPDATE {schema}.fair_share_cursors AS turn
    SET partition_key = served_last.partition_key
    FROM served_last
    WHERE turn.queue = served_last.queue
      AND turn.ctid = ANY(ARRAY(
          SELECT held.ctid FROM {schema}.fair_share_cursors AS held
          WHERE held.queue = ANY(ARRAY(SELECT queue FROM served_last))
          FOR UPDATE SKIP LOCKED
      ))
),
first_turn AS (
    -- A queue's first claim of jobs with a key writes its turn.
    INSERT INTO {schema}.fair_share_cursors (queue, partition_key)
    SELECT served_last.queue, served_last.partition_key
    FROM served_last JOIN room ON room.queue = served_last.queue
    WHERE room.turn_after IS NULL
    ON CONFLICT (queue) DO NOTHING
)
SELECT * FROM claimed;

-- name: job_claim_lock
-- Run before job_claim in its transaction: the rows of the requested queues that have
-- a concurrency or a rate limit (of the queue, or per partition key), locked in name
-- order, so that two claims of a limited queue take turns and the second one's
-- statement sees what the first claimed. A queue without limits takes no lock. Which queues it locked is left for job_claim in
-- a setting local to the transaction.
SELECT set_config('pgqueue.claim_locked',
                  coalesce(array_agg(limited.queue), ARRAY[]::text[])::text, true) AS locked
FROM (
    SELECT queue FROM {schema}.queue_settings
    WHERE queue = ANY(%(queues)s::text[])
      AND NOT paused
      AND (concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL
           OR partition_concurrency_limit IS NOT NULL OR partition_rate_limit IS NOT NULL)
    ORDER BY queue
    FOR NO KEY UPDATE
) AS limited;

-- name: job_claim_times
-- started_at and lease_expires_at as the claim set them, run in its transaction after
-- it: claim_clock() gives the time the claim read (see schema.sql), and the expression
-- is the claim's own. And whether any of the queues has settings or queued jobs with a
-- partition key, which job_claim leaves alone: the next claim of these queues takes
-- job_claim_limited if so, job_claim if not.
SELECT {schema}.claim_clock() AS started_at,
       {schema}.claim_clock() + make_interval(secs => %(lease_seconds)s) AS lease_expires_at,
       EXISTS (SELECT FROM {schema}.queue_settings
               WHERE queue = ANY(%(queues)s::text[]))
       OR EXISTS (SELECT FROM {schema}.active_jobs
                  WHERE state = 'queued' AND queue = ANY(%(queues)s::text[])
                    AND partition_key IS NOT NULL) AS settings;

-- name: job_heartbeat_many
-- Extends every lease still held, and returns the ids of the leases that were lost.
-- A heartbeat never waits for a row lock: a row another transaction holds is being
-- acked, failed, cancelled or reaped right now, so its lease is either about to end or
-- still held, and the next beat finds out which (leases outlive several beats). Waiting
-- would let a heartbeat and an ack of the same leases, each holding rows the other
-- needs, deadlock whenever the two statements' plans visit the rows in different orders.
WITH lease AS (
    SELECT id, token FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS lease (id, token)
),
held AS (
    -- FOR NO KEY UPDATE, the lock the UPDATE below takes anyway: it skips the rows an
    -- ack, a failure, a cancel or the reaper holds, but not a job a handler's
    -- transaction holds by job_fence (FOR KEY SHARE), whose lease must go on being
    -- extended for as long as that transaction keeps the reaper from it.
    SELECT job.id FROM {schema}.active_jobs AS job JOIN lease USING (id)
    WHERE job.lease_token = lease.token AND job.state = 'running'
    FOR NO KEY UPDATE OF job SKIP LOCKED
),
extended AS (
    UPDATE {schema}.active_jobs AS job
    SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
    FROM held
    WHERE job.id = held.id
    RETURNING job.id
),
seen AS (
    -- With a %(worker_id)s (pgqueue worker), the worker's row in the registry is renewed
    -- by the beat it sends anyway, and written again if it was lost (expired during an
    -- outage, or an unlogged table emptied by a crash).
    INSERT INTO {schema}.workers AS worker
        (id, host, pid, version, queues, tasks, concurrency, started_at, last_seen_at,
         expires_at)
    SELECT %(worker_id)s, %(worker_host)s, %(worker_pid)s, %(worker_version)s,
           %(worker_queues)s::text[], %(worker_tasks)s::text[], %(worker_concurrency)s,
           %(worker_started_at)s, now(), now() + make_interval(secs => %(worker_seconds)s)
    WHERE %(worker_id)s::text IS NOT NULL
    ON CONFLICT (id) DO UPDATE
    SET last_seen_at = excluded.last_seen_at, expires_at = excluded.expires_at
),
kept AS (
    -- The first worker to beat after the registry was lost (see workers_kept_since)
    -- says since when it is kept again; every other beat only reads that it is.
    INSERT INTO {schema}.workers_kept_since AS kept (since, server_started)
    SELECT now(), pg_postmaster_start_time()
    WHERE %(worker_id)s::text IS NOT NULL
      AND NOT EXISTS (SELECT FROM {schema}.workers_kept_since
                      WHERE server_started = pg_postmaster_start_time())
    ON CONFLICT (one) DO UPDATE
    SET since = excluded.since, server_started = excluded.server_started
)
-- Lost: neither extended nor, as this statement's snapshot saw it, still ours and
-- merely locked by someone else.
SELECT lease.id FROM lease
WHERE NOT EXISTS (SELECT FROM extended WHERE extended.id = lease.id)
  AND NOT EXISTS (
      SELECT FROM {schema}.active_jobs AS job
      WHERE job.id = lease.id AND job.lease_token = lease.token AND job.state = 'running'
  );

-- name: job_finish_many
-- What became of a batch of attempts, for the leases still held, in one statement:
-- running -> succeeded for each result, and for each error running -> queued after the
-- delay given, or -> dead once the job's attempts are used up. Finished jobs move from
-- active_jobs to finished_jobs, and the queues' counters and the run-time histogram
-- grow. The delays come from pgqueue.backoff, the one place they are worked out, and
-- the reaper finishes expired leases through this statement too.
--
-- Returns one row per failed attempt written (its position in the arrays, counted
-- from 1, and what it left: state, run_at, errors, has_dependents), or a single row of
-- NULLs in those columns when there was none. Every row also carries the statement's
-- time (every job it finished shares it), the positions of the outcomes refused
-- because their lease was no longer held, and how many waiting jobs it released.
-- Nothing else per job comes back: the worker already holds the rest of each row. One
-- batch may carry two outcomes of the same job (a stale attempt's and the one that
-- re-claimed it after a cancel and retry, or a reap); only the holder of the current
-- token is written.
--
-- Its time (finished_at, and failed_at in the error history) is now(), the start of its
-- transaction, shared by every statement of a batch too large for one: it opens its
-- transaction (a worker's, or the one it shares with the next claim, where it comes
-- first), and that transaction begins after the claims of the leases it finishes
-- committed; the reaper's begins after those leases expired. So it never precedes an
-- attempt's start, and a job it releases is claimed later (see claim_clock).
WITH outcome AS (
    -- The outcomes arrive as texts zipped back into rows here: a worker sends
    -- thousands a second, and a few strings cost the client a fraction of arrays dumped
    -- element by element. A batch of successes only sends NULL errors and delays,
    -- which ROWS FROM pads out with NULLs.
    SELECT id, token, result, error, delay, position
    FROM ROWS FROM (
        unnest(%(ids)s::bigint[]),
        unnest(%(tokens)s::uuid[]),
        jsonb_array_elements(%(results)s::jsonb),
        jsonb_array_elements_text(%(errors)s::jsonb),
        unnest(%(delays)s::float8[])
    ) WITH ORDINALITY AS outcome (id, token, result, error, delay, position)
),
retried AS (
    UPDATE {schema}.active_jobs AS job
    SET state = 'queued',
        run_at = now() + make_interval(secs => outcome.delay),
        last_error = outcome.error,
        errors = {schema}.errors_appended(job.errors, job.attempts, job.worker_id, outcome.error),
        lease_token = NULL,
        lease_expires_at = NULL
    FROM outcome
    WHERE job.id = outcome.id AND job.lease_token = outcome.token AND job.state = 'running'
      AND outcome.error IS NOT NULL AND job.attempts < job.max_attempts
    RETURNING job.queue, job.run_at, job.errors, job.has_dependents, outcome.position
),
ended AS (
    DELETE FROM {schema}.active_jobs AS job
    USING outcome
    WHERE job.id = outcome.id AND job.lease_token = outcome.token AND job.state = 'running'
      AND (outcome.error IS NULL OR job.attempts >= job.max_attempts)
    RETURNING job.*, outcome.result AS outcome, outcome.error AS failure, outcome.position,
              CASE WHEN outcome.error IS NOT NULL
                   THEN {schema}.errors_appended(job.errors, job.attempts, job.worker_id,
                                                 outcome.error)
              END AS errors_now
),
moved AS (
    -- A success keeps the errors of earlier attempts in errors, and leaves last_error
    -- NULL: it is for jobs that have not succeeded.
    INSERT INTO {schema}.finished_jobs
        (id, queue, task, payload, priority, state, run_at, attempts, max_attempts,
         timeout_seconds, worker_id, enqueued_at, started_at, finished_at, last_error,
         result, idempotency_key, errors, trace_context, unique_key, has_dependents,
         tags, progress, partition_key)
    SELECT id, queue, task, payload, priority,
           (CASE WHEN failure IS NULL THEN 'succeeded' ELSE 'dead' END)::{schema}.job_state,
           run_at, attempts,
           max_attempts, timeout_seconds, worker_id, enqueued_at, started_at, now(), failure,
           CASE WHEN failure IS NULL THEN outcome ELSE result END, idempotency_key,
           coalesce(errors_now, errors), trace_context, unique_key, has_dependents,
           tags, progress, partition_key
    FROM ended
),
run AS (
    -- The acked attempts per queue, task and claim: the jobs of one claim share their
    -- started_at, and the statement's now() is one value, so the run time is worked out
    -- once per claim, not once per job, and the counters and the histogram below both
    -- add up these few rows.
    SELECT queue, task, count(*) AS attempts,
           greatest(0, date_part('epoch', now() - coalesce(started_at, now()))) AS seconds
    FROM ended
    WHERE failure IS NULL
    GROUP BY queue, task, started_at
),
timed AS (
    -- The run-time histogram (see run_time_buckets): per queue, task and bucket, the
    -- attempts acked and their seconds. An attempt falls in the bucket of the smallest
    -- bound at or above its run time: width_bucket() gives the largest bound at or
    -- below it, and the next one unless the run time equals that bound.
    INSERT INTO {schema}.run_time_buckets AS bucket (queue, task, le, slot, attempts, seconds)
    SELECT queue, task, le[position + (position = 0 OR seconds > le[position])::int],
           {schema}.counter_slot(), sum(attempts), sum(seconds * attempts)
    FROM (
        SELECT queue, task, attempts, seconds, le, width_bucket(seconds, le) AS position
        FROM run, (SELECT {schema}.run_time_bounds() AS le) AS bounds
    ) AS placed
    GROUP BY 1, 2, 3
    ORDER BY 1, 2, 3
    ON CONFLICT (queue, task, le, slot) DO UPDATE
    SET attempts = bucket.attempts + excluded.attempts,
        seconds = bucket.seconds + excluded.seconds
),
begun AS (
    -- The pickup wait of each failed attempt that goes back to queued, read before
    -- retried moves its run_at on (this is the statement's snapshot; the token check
    -- makes it the same attempt that retried writes). Only failures: the rare case.
    SELECT outcome.position, job.queue,
           {schema}.pickup_seconds(job.started_at, job.enqueued_at, job.run_at) AS seconds
    FROM outcome
    JOIN {schema}.active_jobs AS job ON job.id = outcome.id
    WHERE outcome.error IS NOT NULL AND job.lease_token = outcome.token
      AND job.state = 'running'
),
picked_up AS (
    -- The pickup histogram (see pickup_buckets): every attempt this statement ended,
    -- once, in the bucket of the smallest bound at or above its wait (as in timed).
    INSERT INTO {schema}.pickup_buckets AS bucket (queue, le, slot, attempts, seconds)
    SELECT queue, le[position + (position = 0 OR seconds > le[position])::int],
           {schema}.counter_slot(), count(*), sum(seconds)
    FROM (
        SELECT queue, seconds, le, width_bucket(seconds, le) AS position
        FROM (
            SELECT queue, {schema}.pickup_seconds(started_at, enqueued_at, run_at) AS seconds
            FROM ended
            UNION ALL
            SELECT begun.queue, begun.seconds FROM begun JOIN retried USING (position)
        ) AS waited,
        (SELECT {schema}.pickup_bounds() AS le) AS bounds
    ) AS placed
    GROUP BY 1, 2, 3
    ORDER BY 1, 2, 3
    ON CONFLICT (queue, le, slot) DO UPDATE
    SET attempts = bucket.attempts + excluded.attempts,
        seconds = bucket.seconds + excluded.seconds
),
failed AS (
    SELECT position, 'queued' AS state, run_at, errors, has_dependents, queue FROM retried
    UNION ALL
    SELECT position, 'dead', run_at, errors_now, has_dependents, queue
    FROM ended WHERE failure IS NOT NULL
),
counted AS (
    INSERT INTO {schema}.queue_counters AS counter
        (queue, slot, succeeded, completed, dead, failures)
    SELECT queue, {schema}.counter_slot(), sum(succeeded), sum(succeeded), sum(dead),
           sum(failures)
    FROM (
        SELECT queue, attempts AS succeeded, 0 AS dead, 0 AS failures FROM run
        UNION ALL
        SELECT queue, 0, (state = 'dead')::int, 1 FROM failed
    ) AS counts
    GROUP BY queue ORDER BY queue
    ON CONFLICT (queue, slot) DO UPDATE
    SET succeeded = counter.succeeded + excluded.succeeded,
        completed = counter.completed + excluded.completed,
        dead = counter.dead + excluded.dead,
        failures = counter.failures + excluded.failures
),
watched AS (
    -- The jobs this statement finished that someone waits for (see job_waiters in
    -- schema.sql), each announced by id on the done channel as the transaction
    -- commits. Nobody waits, nearly always: the first EXISTS, run once, finds the table
    -- empty, and no job of the batch is looked up. Read once, by the final SELECT.
    SELECT pg_notify({done_channel_name}, ended.id::text)
    FROM ended
    WHERE EXISTS (SELECT FROM {schema}.job_waiters)
      AND EXISTS (SELECT FROM {schema}.job_waiters AS waiter WHERE waiter.job_id = ended.id)
),
written AS (
    SELECT now() AS written_at,
           ARRAY(
               SELECT position FROM outcome
               WHERE position NOT IN (SELECT position FROM ended
                                      UNION ALL SELECT position FROM retried)
               ORDER BY position
           ) AS refused,
           -- The waiting jobs whose last dependency this statement acked become queued
           -- (see dependents_released). Only when an acked job has dependents, the rare
           -- case: has_dependents is read from the row this statement deleted, which is
           -- the latest version, so an enqueue naming one of these jobs as a dependency
           -- either committed before (this statement waited for its row lock) or will
           -- find the job succeeded. The function's own statement takes a new snapshot,
           -- taken after those waits: it sees the dependency rows of the enqueues waited
           -- for. The dependents of dead jobs are cancelled by the caller, in a
           -- statement of their own in the same transaction (see job_dependents_cancel).
           CASE WHEN EXISTS (SELECT FROM ended WHERE failure IS NULL AND has_dependents)
                THEN {schema}.dependents_released(
                         ARRAY(SELECT id FROM ended WHERE failure IS NULL AND has_dependents),
                         {channel_name})
                ELSE 0
           END AS released
)
SELECT written.written_at, written.refused, written.released,
       failed.position, failed.state, failed.run_at, failed.errors, failed.has_dependents
FROM written LEFT JOIN failed ON true
WHERE (SELECT count(*) FROM watched) >= 0
ORDER BY failed.position;

-- name: job_fence
-- Job.fence: holds a running attempt in the caller's transaction, if its lease is still
-- this one's. FOR KEY SHARE conflicts only with FOR UPDATE: the reaper
-- (job_expired_lock, SKIP LOCKED) passes the job by, and a cancel, an ack or a failure
-- of it (each deletes the row or changes its lease token) waits, until the caller's
-- transaction ends; the heartbeat's UPDATE (FOR NO KEY UPDATE) does not wait, so the
-- lease goes on being extended meanwhile. No row: the lease is gone, and the caller
-- fails its transaction (lease_lost_raise).
SELECT id FROM {schema}.active_jobs
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running'
FOR KEY SHARE;

-- name: job_completion_evidence
-- Job.complete, after job_finish_many in the same transaction: what later tells
-- whether that completion committed (job_completions_check). xact is the top-level
-- transaction; row_xmin the (sub)transaction that wrote the finished row, which differs
-- from it inside a savepoint, whose rollback undoes the completion alone.
SELECT pg_current_xact_id()::text AS xact,
       (SELECT xmin::text FROM {schema}.finished_jobs
        WHERE id = %(id)s AND state = 'succeeded') AS row_xmin;

-- name: job_completions_check
-- Whether the completions Job.complete recorded have committed, one row per
-- completion: whether the finished row it wrote is there (found) for every transaction
-- to see, which only the commit of its (sub)transaction makes so, and the status of
-- its transaction, which tells one still open from one rolled back. The status alone
-- is not taken for a commit: after a crash or a failover, a transaction id that never
-- reached the WAL is given out again, to another transaction (one past the next id to
-- be given out, pg_xact_status would refuse: it was lost in the crash, so NULL; this
-- statement's own id, given out now, is the bound).
SELECT completion.position,
       CASE WHEN completion.xact::xid8 < pg_current_xact_id()
            THEN pg_xact_status(completion.xact::xid8)
       END AS status,
       coalesce(finished.xmin::text = completion.row_xmin, false) AS found,
       finished.finished_at
FROM unnest(%(ids)s::bigint[], %(xacts)s::text[], %(row_xmins)s::text[])
     WITH ORDINALITY AS completion (id, xact, row_xmin, position)
LEFT JOIN {schema}.finished_jobs AS finished
       ON finished.id = completion.id AND finished.state = 'succeeded'
ORDER BY completion.position;

-- name: lease_lost_raise
-- Fails the caller's transaction when Job.complete or Job.fence finds the lease gone:
-- an error of PostgreSQL's own, so that no part of the transaction can commit, even if
-- the caller catches the LeaseLost raised from it. {message} is a literal.
DO $pgqueue$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'PQ001',
        MESSAGE = {message},
        HINT = 'Roll the transaction back: this attempt of the job is over, and another '
               'attempt (or none, if it was cancelled) does its work.';
END
$pgqueue$;

-- name: job_expired_lock
-- The running jobs whose lease expired (their worker stopped heartbeating), oldest
-- expiry first, locked for the reaper to finish as failed attempts through
-- job_finish_many in the same transaction. ran_for is how long each attempt had run.
SELECT job.*, now() - job.started_at AS ran_for
FROM {schema}.active_jobs AS job
WHERE state = 'running' AND lease_expires_at < now()
ORDER BY lease_expires_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: job_cancel
-- waiting | queued | running -> cancelled, moved to finished_jobs. Taking the row out
-- of active_jobs fences out a running worker: its outcome finds no lease to finish.
-- finished_at is the clock once the row is taken, not now(): the statement may have
-- waited for the row (a claim of it committing), and the job's timeline must not end
-- before it started.
WITH cancelled AS (
    DELETE FROM {schema}.active_jobs
    WHERE id = %(id)s AND state IN ('waiting', 'queued', 'running')
    RETURNING *
),
moved AS (
    INSERT INTO {schema}.finished_jobs
        (id, queue, task, payload, priority, state, run_at, attempts, max_attempts,
         timeout_seconds, worker_id, enqueued_at, started_at, finished_at, last_error,
         result, idempotency_key, errors, trace_context, unique_key, pending_dependencies,
         has_dependents, tags, progress, partition_key)
    SELECT id, queue, task, payload, priority, 'cancelled', run_at, attempts, max_attempts,
           timeout_seconds, worker_id, enqueued_at, started_at, clock_timestamp(), last_error,
           result, idempotency_key, errors, trace_context, unique_key, pending_dependencies,
           has_dependents, tags, progress, partition_key
    FROM cancelled
    RETURNING *
),
picked_up AS (
    -- A running job's attempt ends here: its pickup wait joins the histogram, as in
    -- job_finish_many.
    INSERT INTO {schema}.pickup_buckets AS bucket (queue, le, slot, attempts, seconds)
    SELECT queue, le[position + (position = 0 OR seconds > le[position])::int],
           {schema}.counter_slot(), 1, seconds
    FROM (
        SELECT queue, seconds, le, width_bucket(seconds, le) AS position
        FROM (
            SELECT queue, {schema}.pickup_seconds(started_at, enqueued_at, run_at) AS seconds
            FROM cancelled
            WHERE state = 'running'
        ) AS waited,
        (SELECT {schema}.pickup_bounds() AS le) AS bounds
    ) AS placed
    ON CONFLICT (queue, le, slot) DO UPDATE
    SET attempts = bucket.attempts + excluded.attempts,
        seconds = bucket.seconds + excluded.seconds
),
counted AS (
    INSERT INTO {schema}.queue_counters AS counter (queue, slot, cancelled)
    SELECT queue, {schema}.counter_slot(), 1 FROM cancelled
    ON CONFLICT (queue, slot) DO UPDATE SET cancelled = counter.cancelled + 1
),
watched AS (
    -- The cancelled jobs that someone waits for, announced as in job_finish_many.
    SELECT pg_notify({done_channel_name}, cancelled.id::text)
    FROM cancelled
    WHERE EXISTS (SELECT FROM {schema}.job_waiters)
      AND EXISTS (SELECT FROM {schema}.job_waiters AS waiter WHERE waiter.job_id = cancelled.id)
)
SELECT * FROM moved
WHERE (SELECT count(*) FROM watched) >= 0;

-- name: job_retry
-- dead | cancelled -> queued, moved back to active_jobs, runnable now, with its
-- attempts reset; or -> waiting, for a job with dependencies, which the same
-- transaction then checks (dependents_check): queued at once if they all succeeded,
-- waiting for the others otherwise, and refused if one ended dead or cancelled. The
-- dependents cancelled when this job failed stay cancelled. Its errors history and
-- last_error stay. A unique key that another queued or running job holds now fails the
-- statement (unique_violation on active_jobs_unique_key_idx), and nothing changes:
-- Queue.retry names the holder.
WITH revived AS (
    DELETE FROM {schema}.finished_jobs
    WHERE id = %(id)s AND state IN ('dead', 'cancelled')
    RETURNING *
),
requeued AS (
    INSERT INTO {schema}.active_jobs
        (id, queue, task, payload, priority, state, run_at, attempts, max_attempts,
         timeout_seconds, enqueued_at, started_at, last_error, idempotency_key, errors,
         trace_context, unique_key, has_dependents, tags, progress, partition_key)
    SELECT id, queue, task, payload, priority,
           CASE WHEN EXISTS (SELECT FROM {schema}.job_dependencies AS link
                             WHERE link.job_id = revived.id)
                THEN 'waiting' ELSE 'queued' END::{schema}.job_state,
           now(), 0, max_attempts, timeout_seconds, enqueued_at, started_at, last_error,
           idempotency_key, errors, trace_context, unique_key, has_dependents, tags,
           progress, partition_key
    FROM revived
    RETURNING *
),
waiting AS (
    INSERT INTO {schema}.dependents_to_check (job_id)
    SELECT id FROM requeued WHERE state = 'waiting'
),
rewaited AS (
    -- Its dependents in 'finished' mode that still wait counted it off when it ended:
    -- they wait for it again, so that its next end is counted once. (Those released
    -- already are not brought back.) Lower ids first, as every statement locks jobs;
    -- through a function of the schema's owner, since a producer's retry comes here.
    SELECT {schema}.finished_dependents_recounted(
        ARRAY(SELECT link.job_id FROM {schema}.job_dependencies AS link
              WHERE link.depends_on = (SELECT id FROM requeued) AND link.finished_mode
              ORDER BY link.job_id),
        ARRAY(SELECT 1 FROM {schema}.job_dependencies AS link
              WHERE link.depends_on = (SELECT id FROM requeued) AND link.finished_mode
              ORDER BY link.job_id)
    )
),
counted AS (
    INSERT INTO {schema}.queue_counters AS counter (queue, slot, dead, cancelled)
    SELECT queue, {schema}.counter_slot(),
           -count(*) FILTER (WHERE state = 'dead'), -count(*) FILTER (WHERE state = 'cancelled')
    FROM revived GROUP BY queue
    ON CONFLICT (queue, slot) DO UPDATE
    SET dead = counter.dead + excluded.dead, cancelled = counter.cancelled + excluded.cancelled
),
woken AS (
    -- Wakes the workers waiting on these queues (see queue_waiters in schema.sql): one
    -- notification per queue with a live waiter, naming the queue, never a payload,
    -- sent when the transaction commits. Read once, by the subquery below.
    SELECT pg_notify({channel_name}, wanted.queue)
    FROM (SELECT DISTINCT queue FROM requeued WHERE state = 'queued') AS wanted
    WHERE EXISTS (
        SELECT FROM {schema}.queue_waiters AS waiter
        WHERE waiter.queue = wanted.queue AND waiter.expires_at > now()
    )
)
-- With the state it was retried from, for a retry that its dependencies refuse.
SELECT requeued.*, revived.state::text AS retried_from
FROM requeued JOIN revived USING (id)
WHERE (SELECT count(*) FROM woken) >= 0 AND (SELECT count(*) FROM rewaited) >= 0;

-- name: job_get
SELECT * FROM {schema}.jobs WHERE id = %(id)s;

-- name: job_list
-- Newest first; {filters} holds one "AND column = %(column)s" per filter given (see
-- Queue.list), so that a state filter prunes finished_jobs' partitions.
SELECT * FROM {schema}.jobs
WHERE true {filters}
ORDER BY id DESC
LIMIT %(limit)s;

-- name: job_search
-- job_list with a tag or payload filter ({filters} as there, with "tags @> ..." and
-- "payload @> ..."). The queued and running jobs that match are found first, through
-- active_jobs_tags_idx or active_jobs_payload_idx: the planner cannot tell how few
-- rows a containment matches, and as one query over the jobs view it may prefer to walk
-- the primary key newest first, filtering, which reads the whole backlog when the
-- matches are few. The finished jobs are read newest first, each partition through its
-- id index, until the page is full or history runs out (no index serves the filter
-- there). A state filter leaves out the half that cannot hold that state.
WITH active AS MATERIALIZED (
    SELECT * FROM {schema}.active_jobs WHERE true {filters}
)
SELECT * FROM (
    (SELECT * FROM active ORDER BY id DESC LIMIT %(limit)s)
    UNION ALL
    (SELECT * FROM {schema}.finished_jobs WHERE true {filters} ORDER BY id DESC
     LIMIT %(limit)s)
) AS found
ORDER BY id DESC
LIMIT %(limit)s;

-- name: job_progress_write
-- The latest progress that running handlers reported (Job.progress), for the leases
-- given, fenced as an outcome is: a lease that was lost (reaped, cancelled) writes
-- nothing. As a heartbeat does, it never waits for a row lock: a row another
-- transaction holds is being finished or beaten right now, and the worker writes its
-- progress again on its next round, so the two never wait for each other in a cycle.
-- Returns the ids written. Touches no indexed column: a HOT update.
WITH reported AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(fractions)s::float8[],
                         %(messages)s::text[]) AS reported (id, token, fraction, message)
),
held AS (
    SELECT job.id, reported.fraction, reported.message
    FROM {schema}.active_jobs AS job JOIN reported USING (id)
    WHERE job.lease_token = reported.token AND job.state = 'running'
    FOR NO KEY UPDATE OF job SKIP LOCKED
)
UPDATE {schema}.active_jobs AS job
SET progress = jsonb_build_object('fraction', held.fraction, 'message', held.message,
                                  'at', now())
FROM held
WHERE job.id = held.id
RETURNING job.id;

-- name: job_get_by_idempotency_key
-- The job holding an idempotency key: one primary-key lookup, then one by id.
SELECT job.* FROM {schema}.idempotency_keys AS taken
JOIN {schema}.jobs AS job ON job.id = taken.job_id
WHERE taken.key = %(key)s;

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

-- name: job_throttle_many
-- Handlers that raised Throttle: each running job whose lease is still held goes back
-- to queued, runnable after its delay, and gives its attempt back (the claim counted
-- it: attempts goes down by one, so throttles never bring a job closer to dead). A
-- "partition" scope also throttles the job's key of its queue, a "queue" scope the
-- whole queue, until the same time (a later end wins over an earlier one, never the
-- other way). Returns the ids written; a lease lost meanwhile writes nothing.
WITH throttle AS (
    SELECT id, token, delay, scope
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(delays)s::float8[],
                %(scopes)s::text[]) AS throttle (id, token, delay, scope)
),
requeued AS (
    UPDATE {schema}.active_jobs AS job
    SET state = 'queued',
        run_at = now() + make_interval(secs => throttle.delay),
        attempts = greatest(job.attempts - 1, 0),
        lease_token = NULL,
        lease_expires_at = NULL
    FROM throttle
    WHERE job.id = throttle.id AND job.lease_token = throttle.token
      AND job.state = 'running'
    RETURNING job.id, job.queue, job.partition_key, job.run_at, throttle.scope
),
keys_throttled AS (
    INSERT INTO {schema}.partition_controls AS control
        (queue, partition_key, throttled_until)
    SELECT queue, partition_key, max(run_at) FROM requeued
    WHERE scope = 'partition' AND partition_key IS NOT NULL
    GROUP BY queue, partition_key
    ORDER BY queue, partition_key
    ON CONFLICT (queue, partition_key) DO UPDATE
    SET throttled_until = greatest(control.throttled_until, excluded.throttled_until)
),
queues_throttled AS (
    INSERT INTO {schema}.queue_settings AS setting (queue, throttled_until)
    SELECT queue, max(run_at) FROM requeued
    WHERE scope = 'queue'
    GROUP BY queue
    ORDER BY queue
    ON CONFLICT (queue) DO UPDATE
    SET throttled_until = greatest(setting.throttled_until, excluded.throttled_until)
)
SELECT id FROM requeued;

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

-- name: job_prune
-- Deletes one batch of finished jobs older than the cutoff, frees their idempotency
-- keys and takes them off their queues' counters; run until it deletes fewer than the
-- batch. {table} is finished_jobs for pruning by hand (Queue.prune), or one of its
-- DEFAULT partitions: retention drops whole days instead (see pgqueue.history).
WITH gone AS (
    DELETE FROM {schema}.{table}
    WHERE id IN (
        SELECT id FROM {schema}.{table}
        WHERE state = ANY(%(states)s::{schema}.job_state[])
          AND finished_at < now() - make_interval(secs => %(older_than_seconds)s)
        LIMIT %(batch_size)s
        FOR UPDATE SKIP LOCKED
    )
      AND state = ANY(%(states)s::{schema}.job_state[])
      AND finished_at < now() - make_interval(secs => %(older_than_seconds)s)
    RETURNING id, queue, state, idempotency_key
),
freed AS (
    DELETE FROM {schema}.idempotency_keys AS taken
    USING gone
    WHERE taken.key = gone.idempotency_key AND taken.job_id = gone.id
),
unlinked AS (
    DELETE FROM {schema}.job_dependencies AS dependency
    USING gone
    WHERE dependency.job_id = gone.id
),
counted AS (
    INSERT INTO {schema}.queue_counters AS counter (queue, slot, succeeded, dead, cancelled)
    SELECT queue, {schema}.counter_slot(),
           -count(*) FILTER (WHERE state = 'succeeded'),
           -count(*) FILTER (WHERE state = 'dead'),
           -count(*) FILTER (WHERE state = 'cancelled')
    FROM gone GROUP BY queue ORDER BY queue
    ON CONFLICT (queue, slot) DO UPDATE
    SET succeeded = counter.succeeded + excluded.succeeded,
        dead = counter.dead + excluded.dead,
        cancelled = counter.cancelled + excluded.cancelled
)
SELECT count(*) AS deleted FROM gone;

-- name: reaper_try_lock
-- Transaction-scoped, so it is safe behind PgBouncer; the reap runs in the same transaction.
-- A reaper paused inside this transaction (a frozen VM, SIGSTOP) would keep the lock, and
-- every other worker from reaping, until it resumed: the server ends such a session once
-- it has sat idle in the transaction for 5 s (for this transaction only).
SELECT pg_try_advisory_xact_lock(%(key)s) AS locked,
       set_config('idle_in_transaction_session_timeout', '5s', true) AS idle_limit;

-- name: migration_lock
SELECT pg_advisory_xact_lock(%(key)s);

-- name: migration_table_create
CREATE TABLE IF NOT EXISTS {schema}.migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migration_applied
SELECT version, name FROM {schema}.migrations ORDER BY version;

-- name: migration_record
INSERT INTO {schema}.migrations (version, name) VALUES (%(version)s, %(name)s);

-- name: database_now
SELECT now() AS now;

-- name: database_ping
-- The health check: the server answers a query.
SELECT 1 AS ok;

-- name: job_next_run_delay
-- Seconds until the next job this worker could claim becomes runnable (zero or less:
-- one is runnable now), on the database clock, so a worker sleeps exactly until then.
-- A paused queue's jobs are not waited for (resuming it notifies), a throttled queue's
-- until its throttle ends, and a rate-limited queue's only once its bucket holds a
-- whole job.
-- Reads, per queue and task asked for, the first queued job without a partition key of
-- each priority that has some, highest first: one probe of active_jobs_claim_idx each,
-- which orders a priority's jobs by run_at, so its first is the one due soonest.
-- However many jobs are queued, of those tasks or any other. Jobs with a key are not
-- ordered by run_at in any index: a queue that has some queued counts as runnable now,
-- and the worker looks again as it does when a limit holds its jobs back (see
-- pgqueue_worker.slots).
WITH RECURSIVE firsts AS (
    SELECT wanted.queue, served.task, first.priority, first.run_at
    FROM unnest(%(queues)s::text[]) AS wanted (queue)
    CROSS JOIN unnest(%(tasks)s::text[]) AS served (task)
    CROSS JOIN LATERAL (
        SELECT priority, run_at FROM {schema}.active_jobs
        WHERE state = 'queued' AND queue = wanted.queue AND task = served.task
          AND partition_key IS NULL
        ORDER BY priority DESC, run_at, id
        LIMIT 1
    ) AS first
    UNION ALL
    SELECT higher.queue, higher.task, lower.priority, lower.run_at
    FROM firsts AS higher
    CROSS JOIN LATERAL (
        SELECT priority, run_at FROM {schema}.active_jobs
        WHERE state = 'queued' AND queue = higher.queue AND task = higher.task
          AND partition_key IS NULL AND priority < higher.priority
        ORDER BY priority DESC, run_at, id
        LIMIT 1
    ) AS lower
),
keyed AS (
    SELECT wanted.queue, now() AS run_at
    FROM unnest(%(queues)s::text[]) AS wanted (queue)
    WHERE EXISTS (SELECT FROM {schema}.active_jobs
                  WHERE state = 'queued' AND queue = wanted.queue
                    AND task = ANY(%(tasks)s::text[]) AND partition_key IS NOT NULL)
),
next AS (
    SELECT queue, min(run_at) AS run_at
    FROM (SELECT queue, run_at FROM firsts UNION ALL SELECT queue, run_at FROM keyed) AS due
    GROUP BY queue
)
SELECT min(greatest(
           extract(epoch FROM next.run_at - now()),
           extract(epoch FROM setting.throttled_until - clock_timestamp()),
           (1 - least(greatest(1, setting.rate_limit / 10),
                      setting.tokens + setting.rate_limit * greatest(0, extract(
                          epoch FROM clock_timestamp() - setting.tokens_at))))
               / setting.rate_limit))::float8 AS seconds
FROM next
LEFT JOIN {schema}.queue_settings AS setting ON setting.queue = next.queue
WHERE NOT coalesce(setting.paused, false);

-- name: jobs_listen
-- Subscribes the session to the channel that enqueues and retries notify (for queues
-- with a waiter; see job_claim and job_insert).
LISTEN {channel};

-- name: waiters_forget
-- A worker that stops no longer waits.
DELETE FROM {schema}.queue_waiters
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM {schema}.queue_waiters
    WHERE waiter = ANY(%(waiters)s::text[])
    FOR UPDATE SKIP LOCKED
));

-- name: waiters_expired_delete
-- The rows of waiters that stopped without saying so (killed, cut off): harmless while
-- they last (enqueues into their queues notify), removed by the reaper.
DELETE FROM {schema}.queue_waiters
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM {schema}.queue_waiters
    WHERE expires_at < now()
    FOR UPDATE SKIP LOCKED
));

-- name: job_waiters_listen
-- Subscribes a job watcher's session (see pgqueue.job_watch) to the channel on which
-- finished jobs that someone waits for are announced (see job_waiters in schema.sql).
LISTEN {done_channel};

-- name: job_waiters_register
-- A watcher waits for these jobs, until expires_at: its rows are written, or renewed
-- (every few seconds while it waits). It then reads their states (job_waiters_states)
-- in a transaction of its own: a job whose finishing statement began before this row
-- was committed is not announced, but that statement has either committed by then, and
-- the job reads as final, or is still under way, a rare race that the watcher's slow
-- re-check of every job it waits for settles.
INSERT INTO {schema}.job_waiters AS waiting (job_id, waiter, expires_at)
SELECT job_id, %(waiter)s, now() + make_interval(secs => %(seconds)s)
FROM unnest(%(ids)s::bigint[]) AS job_id
ORDER BY job_id
ON CONFLICT (job_id, waiter) DO UPDATE SET expires_at = excluded.expires_at;

-- name: job_waiters_states
-- The state of each of these jobs that exists, for a watcher: one index lookup each.
SELECT id, state::text AS state FROM {schema}.jobs WHERE id = ANY(%(ids)s::bigint[]);

-- name: job_waiters_forget
-- A watcher no longer waits for these jobs (or for any, as it stops).
DELETE FROM {schema}.job_waiters
WHERE waiter = %(waiter)s
  AND (%(ids)s::bigint[] IS NULL OR job_id = ANY(%(ids)s::bigint[]));

-- name: job_waiters_expired_delete
-- The rows of watchers that stopped without saying so (killed, cut off): harmless while
-- they last (the jobs they name are announced when they finish), removed by the reaper
-- and by every watcher's renewal.
DELETE FROM {schema}.job_waiters
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM {schema}.job_waiters
    WHERE expires_at < now()
    FOR UPDATE SKIP LOCKED
));

-- name: pruner_try_lock
-- The automatic pruner's turn: transaction-scoped, like the reaper's, so it is safe
-- behind PgBouncer; each of its steps (a day created or dropped, a batch deleted from a
-- DEFAULT partition) runs in the same transaction, so however many workers run a
-- pruner, one changes the history at a time.
SELECT pg_try_advisory_xact_lock(%(key)s) AS locked;

-- name: history_days
-- The day partitions of finished_jobs: per finished state, the partitions named
-- finished_jobs_<state>_pYYYYMMDD that pgqueue.history created (and the DEFAULT ones,
-- which it leaves alone).
SELECT child.relname AS name, parent.relname AS parent
FROM pg_inherits
JOIN pg_class AS child ON child.oid = pg_inherits.inhrelid
JOIN pg_class AS parent ON parent.oid = pg_inherits.inhparent
JOIN pg_namespace AS ns ON ns.oid = parent.relnamespace
WHERE ns.nspname = %(schema)s
  AND parent.relname IN ('finished_jobs_succeeded', 'finished_jobs_dead',
                         'finished_jobs_cancelled')
ORDER BY child.relname;

-- name: history_step_lock
-- A short wait for the table locks of a partition change, instead of queueing every
-- ack behind it while a long query on the history runs: the step is tried again next
-- round.
SELECT set_config('lock_timeout', '2s', true) AS lock_timeout;

-- name: history_owned
-- Whether this session's role may create and drop the history's days: PostgreSQL
-- allows a partition to be attached only by the owner of its parent (or a member of
-- the owner's role).
SELECT coalesce(pg_has_role(table_.relowner, 'USAGE'), false) AS owned
FROM pg_class AS table_
JOIN pg_namespace AS ns ON ns.oid = table_.relnamespace
WHERE ns.nspname = %(schema)s AND table_.relname = 'finished_jobs';

-- name: history_default_size
-- The size on disk of one state's DEFAULT partition, in bytes: whether attaching a day
-- may check it under a lock that acks wait for (see pgqueue.history).
SELECT pg_relation_size(table_.oid) AS bytes
FROM pg_class AS table_
JOIN pg_namespace AS ns ON ns.oid = table_.relnamespace
WHERE ns.nspname = %(schema)s AND table_.relname = %(table)s;

-- name: history_default_lock
-- Nothing finishes into, or is read from, a DEFAULT partition while one of its days is
-- moved out of it and attached: for a moment, as the partition is small.
LOCK TABLE {schema}.{default} IN ACCESS EXCLUSIVE MODE;

-- name: history_day_table
-- A day's table, created on its own (not yet a partition) unless it exists: the columns,
-- defaults and indexes of its state's partitions, and a constraint that it holds only
-- rows of that state and day ({bound}), so that attaching it need not read it.
CREATE TABLE IF NOT EXISTS {schema}.{partition} (
    LIKE {schema}.{parent} INCLUDING ALL,
    CONSTRAINT {bound} CHECK (state = {state} AND finished_at >= {start} AND finished_at < {end})
);

-- name: history_day_fill
-- Moves up to %(batch_size)s jobs of a day from its state's DEFAULT partition into the
-- day's table, before it is attached; skips rows locked now (a retry or a prune of
-- them), which the next batch finds. Returns how many moved.
WITH moved AS (
    DELETE FROM {schema}.{default}
    WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM {schema}.{default}
        WHERE finished_at >= {start} AND finished_at < {end}
        LIMIT %(batch_size)s
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING *
),
filled AS (
    INSERT INTO {schema}.{partition} SELECT * FROM moved
)
SELECT count(*) AS jobs FROM moved;

-- name: history_day_attach
-- A day's table becomes the day's partition. Reads neither it (its {bound} says what
-- it holds) nor, when the DEFAULT partition has the day's fence, the DEFAULT partition;
-- otherwise the DEFAULT partition is read, under its lock (only when it is small).
ALTER TABLE {schema}.{parent}
    ATTACH PARTITION {schema}.{partition} FOR VALUES FROM ({start}) TO ({end});

-- name: history_day_unbound
-- Once attached, the partition's bound says what its constraint said.
ALTER TABLE {schema}.{partition} DROP CONSTRAINT IF EXISTS {bound};

-- name: history_fence_add
-- A large DEFAULT partition refuses a coming day's rows from now on ({fence}), without
-- reading it (NOT VALID), while the day is made; see pgqueue.history.
ALTER TABLE {schema}.{default}
    ADD CONSTRAINT {fence} CHECK (finished_at < {start} OR finished_at >= {end}) NOT VALID;

-- name: history_fence_validate
-- Reads the whole DEFAULT partition, to prove it holds none of the day's rows, under a
-- lock that neither acks nor readers wait for (SHARE UPDATE EXCLUSIVE).
ALTER TABLE {schema}.{default} VALIDATE CONSTRAINT {fence};

-- name: history_fence_drop
ALTER TABLE {schema}.{default} DROP CONSTRAINT IF EXISTS {fence};

-- name: history_fences
-- The names of the fences on the DEFAULT partitions (see history_fence_add).
SELECT fence.conname AS fence
FROM pg_constraint AS fence
JOIN pg_class AS default_ ON default_.oid = fence.conrelid
JOIN pg_namespace AS ns ON ns.oid = default_.relnamespace
WHERE ns.nspname = %(schema)s
  AND default_.relname IN ('finished_jobs_succeeded_default', 'finished_jobs_dead_default',
                           'finished_jobs_cancelled_default')
  AND fence.contype = 'c'
  AND fence.conname LIKE 'finished\_jobs\_%%\_default\_fence\_p%%'
ORDER BY fence.conname;

-- name: history_fence
-- Whether a fence is validated (no row: there is no such fence).
SELECT fence.convalidated AS validated
FROM pg_constraint AS fence
JOIN pg_class AS default_ ON default_.oid = fence.conrelid
JOIN pg_namespace AS ns ON ns.oid = default_.relnamespace
WHERE ns.nspname = %(schema)s AND fence.conname = %(fence)s AND fence.contype = 'c';

-- name: history_table
-- Whether a table of the history is a partition (no row: there is no such table).
SELECT table_.relispartition AS attached
FROM pg_class AS table_
JOIN pg_namespace AS ns ON ns.oid = table_.relnamespace
WHERE ns.nspname = %(schema)s AND table_.relname = %(table)s AND table_.relkind = 'r';

-- name: history_day_unstage
-- A day given up before it was attached: the jobs moved into its table go back to the
-- DEFAULT partition, through the state's table, once the fence is gone (history_day_drop
-- then drops the table).
INSERT INTO {schema}.{parent} SELECT * FROM {schema}.{partition};

-- name: history_day_lock
-- Nothing may finish into, or retry out of, a day while it is counted and dropped.
LOCK TABLE {schema}.{partition} IN ACCESS EXCLUSIVE MODE;

-- name: history_day_release
-- Before a day is dropped: its jobs' idempotency keys are freed and its jobs taken off
-- their queues' counters. Reads the day once.
WITH day AS (
    SELECT id, queue, state, idempotency_key FROM {schema}.{partition}
),
freed AS (
    DELETE FROM {schema}.idempotency_keys AS taken
    USING day
    WHERE taken.key = day.idempotency_key AND taken.job_id = day.id
),
unlinked AS (
    DELETE FROM {schema}.job_dependencies AS dependency
    USING day
    WHERE dependency.job_id = day.id
),
counted AS (
    INSERT INTO {schema}.queue_counters AS counter (queue, slot, succeeded, dead, cancelled)
    SELECT queue, {schema}.counter_slot(),
           -count(*) FILTER (WHERE state = 'succeeded'),
           -count(*) FILTER (WHERE state = 'dead'),
           -count(*) FILTER (WHERE state = 'cancelled')
    FROM day GROUP BY queue ORDER BY queue
    ON CONFLICT (queue, slot) DO UPDATE
    SET succeeded = counter.succeeded + excluded.succeeded,
        dead = counter.dead + excluded.dead,
        cancelled = counter.cancelled + excluded.cancelled
)
SELECT count(*) AS jobs FROM day;

-- name: history_day_drop
DROP TABLE {schema}.{partition};

-- Periodic jobs (see pgqueue.schedules and pgqueue.schedule_store) ----------------

-- name: scheduler_try_lock
-- The scheduler's turn: one process at a time reads the due schedules, enqueues their
-- ticks and moves them on, all in this transaction. Transaction-scoped, like the
-- reaper's, so it is safe behind PgBouncer and dies with a killed worker's session; one
-- that froze inside it is ended after 5 s idle.
SELECT pg_try_advisory_xact_lock(%(key)s) AS locked,
       set_config('idle_in_transaction_session_timeout', '5s', true) AS idle_limit;

-- name: schedule_sync_lock
-- A worker's sync of its plugins' schedules waits for the scheduler's turn (same key),
-- so syncs and runs never interleave, and workers starting together sync one at a time.
SELECT pg_advisory_xact_lock(%(key)s),
       set_config('idle_in_transaction_session_timeout', '5s', true) AS idle_limit;

-- name: schedules_due
-- The enabled schedules whose tick has come on the database's clock, locked until the
-- transaction that enqueues their jobs commits, with that clock's reading.
WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS now)
SELECT schedule.name, schedule.cron, schedule.timezone, schedule.task, schedule.queue,
       schedule.payload, schedule.priority, schedule.max_attempts, schedule.next_run_at,
       schedule.error, clock.now
FROM {schema}.schedules AS schedule, clock
WHERE schedule.enabled
  AND (schedule.next_run_at IS NULL OR schedule.next_run_at <= clock.now)
ORDER BY schedule.name
FOR UPDATE OF schedule;

-- name: schedules_ran
-- Moves each schedule on to its next tick, and records its run (a NULL job_id: the
-- tick had its job already, or next_run_at was only filled in), or, with an error, why
-- the round skipped it (its next_run_at is then when a round looks at it again).
UPDATE {schema}.schedules AS schedule
SET next_run_at = ran.next_run_at,
    last_run_at = CASE WHEN ran.job_id IS NULL THEN schedule.last_run_at ELSE ran.run_at END,
    last_tick_at = CASE WHEN ran.job_id IS NULL THEN schedule.last_tick_at ELSE ran.tick_at END,
    last_job_id = coalesce(ran.job_id, schedule.last_job_id),
    error = ran.error
FROM unnest(%(names)s::text[], %(next_run_ats)s::timestamptz[], %(run_ats)s::timestamptz[],
            %(tick_ats)s::timestamptz[], %(job_ids)s::bigint[], %(errors)s::text[])
     AS ran(name, next_run_at, run_at, tick_at, job_id, error)
WHERE schedule.name = ran.name;

-- name: schedule_next_due
-- Seconds until the next tick of any enabled schedule (NULL: none), for the scheduler
-- to sleep until then.
SELECT extract(epoch FROM min(next_run_at) - clock_timestamp())::float8 AS seconds
FROM {schema}.schedules
WHERE enabled;

-- name: schedule_list
SELECT * FROM {schema}.schedules ORDER BY name;

-- name: schedule_list_locked
-- Every schedule, locked for a sync, with the database's clock.
SELECT schedule.*, clock_timestamp() AS now
FROM {schema}.schedules AS schedule
ORDER BY name
FOR UPDATE;

-- name: schedule_get_locked
SELECT schedule.*, clock_timestamp() AS now
FROM {schema}.schedules AS schedule
WHERE name = %(name)s
FOR UPDATE;

-- name: schedule_insert
INSERT INTO {schema}.schedules
    (name, cron, timezone, task, queue, payload, priority, max_attempts, source, next_run_at)
VALUES (%(name)s, %(cron)s, %(timezone)s, %(task)s, %(queue)s, %(payload)s::jsonb,
        %(priority)s, %(max_attempts)s, %(source)s, %(next_run_at)s);

-- name: schedule_redefine
-- A declared schedule whose definition changed, or which was removed and is declared
-- again; the sync decides enabled, disabled_by and next_run_at. A scheduler's error
-- was about the old definition: the new one, checked by the sync, has none yet.
UPDATE {schema}.schedules
SET cron = %(cron)s, timezone = %(timezone)s, task = %(task)s, queue = %(queue)s,
    payload = %(payload)s::jsonb, priority = %(priority)s, max_attempts = %(max_attempts)s,
    source = %(source)s, enabled = %(enabled)s, disabled_by = %(disabled_by)s,
    next_run_at = %(next_run_at)s, removed_at = NULL, error = NULL, updated_at = now()
WHERE name = %(name)s;

-- name: schedule_remove
-- Schedules their plugin no longer declares: disabled (by the sync, unless the operator
-- had already), never deleted.
UPDATE {schema}.schedules
SET removed_at = now(),
    enabled = false,
    disabled_by = CASE WHEN enabled THEN 'sync' ELSE disabled_by END,
    next_run_at = NULL,
    updated_at = now()
WHERE name = ANY(%(names)s::text[]);

-- name: schedule_set_enabled
-- Enabling starts from a tick the caller worked out, so a scheduler's error, about a
-- row it could not read, no longer holds until a round looks again.
UPDATE {schema}.schedules
SET enabled = %(enabled)s,
    disabled_by = CASE WHEN %(enabled)s THEN NULL ELSE 'operator' END,
    next_run_at = %(next_run_at)s,
    error = CASE WHEN %(enabled)s THEN NULL ELSE error END,
    updated_at = now()
WHERE name = %(name)s
RETURNING *;

-- name: schedule_last_runs
-- For /metrics: when each schedule's last job was enqueued (a few rows).
SELECT name, extract(epoch FROM last_run_at)::float8 AS last_run
FROM {schema}.schedules
WHERE last_run_at IS NOT NULL
ORDER BY name;

-- Jobs that wait for other jobs (see pgqueue.dependencies) ------------------------

-- name: job_dependency_states
-- Before a job that depends on %(ids)s is inserted, in the same transaction: each
-- dependency's state, NULL for an id found nowhere. Nothing is locked: the transaction
-- checks its dependencies again as it commits (see dependents_checked in schema.sql),
-- so that its dependencies' heartbeats, acks and claims never wait for it, however
-- long it stays open. One statement, one snapshot: a job moving from active_jobs to
-- finished_jobs is found in one of them.
SELECT wanted.id, coalesce(active.state, finished.state)::text AS state
FROM unnest(%(ids)s::bigint[]) AS wanted (id)
LEFT JOIN {schema}.active_jobs AS active ON active.id = wanted.id
LEFT JOIN LATERAL (
    SELECT job.state FROM {schema}.finished_jobs AS job
    WHERE job.id = wanted.id AND active.id IS NULL
    LIMIT 1
) AS finished ON true;

-- name: job_dependencies_insert
-- The dependencies of jobs just inserted: one row per (job, dependency) pair, with its
-- place in depends_on and the job's mode; and the %(waiting)s jobs among them, for
-- their transaction to check as it commits (see dependents_checked in schema.sql).
WITH linked AS (
    INSERT INTO {schema}.job_dependencies (depends_on, job_id, position, finished_mode)
    SELECT depends_on, job_id, position, finished_mode
    FROM unnest(%(depends_on)s::bigint[], %(job_ids)s::bigint[], %(positions)s::int[],
                %(finished_modes)s::boolean[])
         AS pair (depends_on, job_id, position, finished_mode)
    ON CONFLICT DO NOTHING
)
INSERT INTO {schema}.dependents_to_check (job_id)
SELECT unnest(%(waiting)s::bigint[]);

-- name: dependents_check
-- dependents_checked (schema.sql), called by a transaction of pgqueue's own just
-- before it commits, rather than by the commit's trigger: the jobs whose state or count
-- it changed. It runs its own statements: read the jobs again in a new one.
SELECT job_id, state FROM {schema}.dependents_checked({channel_name});

-- name: job_get_many
SELECT * FROM {schema}.jobs WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id;

-- name: job_dependencies_failed
-- The dependencies of a job that ended dead or cancelled (a retry of it is refused).
SELECT job.id, job.state::text AS state
FROM {schema}.job_dependencies AS link
JOIN {schema}.finished_jobs AS job ON job.id = link.depends_on
WHERE link.job_id = %(id)s AND job.state IN ('dead', 'cancelled') AND NOT link.finished_mode
ORDER BY job.id;

-- name: job_dependents_cancel
-- waiting -> cancelled for the jobs that depend on %(ids)s, which ended dead or
-- cancelled (%(states)s): each one's last_error names the dependency. A dependent in
-- 'finished' mode is not cancelled: these count off its pending dependencies, as an
-- ack does in dependents_released, and one left with none is queued. With %(among)s,
-- only those of these jobs (an enqueue's own, whose dependency it found dead). One
-- level: the caller runs it again for the cancelled jobs that have dependents of their
-- own, each time in a new statement, so that it sees dependents whose transaction
-- committed while a cancel here waited for a row. finished_at is the clock: a later
-- level, or an enqueue in a transaction begun long before, must not end before the
-- dependency it names.
WITH failed AS (
    SELECT id, state FROM unnest(%(ids)s::bigint[], %(states)s::text[]) AS failed (id, state)
),
doomed AS (
    SELECT DISTINCT ON (dependency.job_id)
           dependency.job_id,
           'dependency ' || failed.id || ' ended ' || failed.state AS reason
    FROM {schema}.job_dependencies AS dependency
    JOIN failed ON failed.id = dependency.depends_on
    WHERE (%(among)s::bigint[] IS NULL OR dependency.job_id = ANY(%(among)s::bigint[]))
      AND NOT dependency.finished_mode
    ORDER BY dependency.job_id, failed.id
),
met AS (
    -- With %(among)s, only the enqueue's own jobs that this cascade cancelled count:
    -- its finished-mode jobs counted them as unmet (they were waiting), but not the
    -- dependencies already dead or cancelled before it.
    SELECT dependency.job_id, count(*)::int AS jobs
    FROM {schema}.job_dependencies AS dependency
    JOIN failed ON failed.id = dependency.depends_on
    WHERE (%(among)s::bigint[] IS NULL OR (dependency.job_id = ANY(%(among)s::bigint[])
                                           AND failed.id = ANY(%(among)s::bigint[])))
      AND dependency.finished_mode
    GROUP BY dependency.job_id
),
released AS (
    -- Through a function of the schema's owner: a producer's cancel comes here.
    SELECT * FROM {schema}.finished_dependents_recounted(
        ARRAY(SELECT job_id FROM met ORDER BY job_id),
        ARRAY(SELECT -jobs FROM met ORDER BY job_id)
    )
),
woken AS (
    SELECT pg_notify({channel_name}, wanted.queue)
    FROM (SELECT DISTINCT queue FROM released WHERE state = 'queued') AS wanted
    WHERE EXISTS (
        SELECT FROM {schema}.queue_waiters AS waiter
        WHERE waiter.queue = wanted.queue AND waiter.expires_at > now()
    )
),
cancelled AS (
    DELETE FROM {schema}.active_jobs AS job
    USING doomed
    WHERE job.id = doomed.job_id AND job.state = 'waiting'
    RETURNING job.*, doomed.reason
),
moved AS (
    INSERT INTO {schema}.finished_jobs
        (id, queue, task, payload, priority, state, run_at, attempts, max_attempts,
         timeout_seconds, worker_id, enqueued_at, started_at, finished_at, last_error,
         result, idempotency_key, errors, trace_context, unique_key, pending_dependencies,
         has_dependents, tags, progress, partition_key)
    SELECT id, queue, task, payload, priority, 'cancelled', run_at, attempts, max_attempts,
           timeout_seconds, worker_id, enqueued_at, started_at, clock_timestamp(), reason,
           result, idempotency_key, errors, trace_context, unique_key, pending_dependencies,
           has_dependents, tags, progress, partition_key
    FROM cancelled
    RETURNING *
),
counted AS (
    INSERT INTO {schema}.queue_counters AS counter (queue, slot, cancelled)
    SELECT queue, {schema}.counter_slot(), count(*) FROM cancelled
    GROUP BY queue ORDER BY queue
    ON CONFLICT (queue, slot) DO UPDATE SET cancelled = counter.cancelled + excluded.cancelled
),
watched AS (
    -- The cancelled jobs that someone waits for, announced as in job_finish_many.
    SELECT pg_notify({done_channel_name}, cancelled.id::text)
    FROM cancelled
    WHERE EXISTS (SELECT FROM {schema}.job_waiters)
      AND EXISTS (SELECT FROM {schema}.job_waiters AS waiter WHERE waiter.job_id = cancelled.id)
)
-- The jobs cancelled, then those released (released true), which changed too.
SELECT moved.*, false AS released FROM moved
WHERE (SELECT count(*) FROM watched) >= 0
UNION ALL
SELECT released.*, true FROM released
WHERE (SELECT count(*) FROM woken) >= 0;

-- name: job_dependencies_get
-- The jobs a job depends on, and the jobs that depend on it, ids ascending.
SELECT ARRAY(SELECT depends_on FROM {schema}.job_dependencies
             WHERE job_id = %(id)s ORDER BY depends_on) AS depends_on,
       ARRAY(SELECT job_id FROM {schema}.job_dependencies
             WHERE depends_on = %(id)s ORDER BY job_id) AS dependents,
       coalesce((SELECT bool_or(finished_mode) FROM {schema}.job_dependencies
                 WHERE job_id = %(id)s), false) AS finished_mode;

-- name: job_dependencies_of_many
-- What the jobs %(ids)s depended on, for their handlers (Job.dependencies): each
-- dependency's id, task, state and result, in the order depends_on named them (links
-- written before pgqueue kept the order come after, by id). A dependency that was
-- pruned is found nowhere: its task, state and result are NULL. By id, one row at a
-- time from each table: what this reads grows with the dependencies, not the history.
SELECT link.job_id, link.depends_on AS id, link.finished_mode, dependency.task,
       dependency.state::text AS state, dependency.result
FROM {schema}.job_dependencies AS link
LEFT JOIN LATERAL (
    SELECT job.task, job.state, job.result FROM {schema}.jobs AS job
    WHERE job.id = link.depends_on
    LIMIT 1
) AS dependency ON true
WHERE link.job_id = ANY(%(ids)s::bigint[])
ORDER BY link.job_id, link.position NULLS LAST, link.depends_on;

-- name: job_neighbours_get
-- A job's page: the first %(limit)s jobs it depends on and the first %(limit)s that
-- depend on it, ids ascending, each with its task and state (NULL: pruned since), and
-- how many there are each way. Through the links' primary key and job_id index, and
-- one lookup by id per job shown, however large the fan-in or fan-out.
WITH shown AS (
    (SELECT 'depends_on' AS direction, depends_on AS id FROM {schema}.job_dependencies
     WHERE job_id = %(id)s ORDER BY depends_on LIMIT %(limit)s)
    UNION ALL
    (SELECT 'dependents', job_id FROM {schema}.job_dependencies
     WHERE depends_on = %(id)s ORDER BY job_id LIMIT %(limit)s)
)
SELECT shown.direction, shown.id, job.task, job.queue, job.state::text AS state,
       (SELECT count(*) FROM {schema}.job_dependencies WHERE job_id = %(id)s)
           AS depends_on_total,
       (SELECT count(*) FROM {schema}.job_dependencies WHERE depends_on = %(id)s)
           AS dependents_total
FROM (SELECT 1) AS one
LEFT JOIN shown ON true
-- One lookup by id per job shown. A join would let the planner, which cannot tell how
-- few they are, read every finished job to hash or merge them in; LIMIT 1 (an id is
-- one job) keeps it from flattening this LATERAL subquery into such a join.
LEFT JOIN LATERAL (SELECT task, queue, state FROM {schema}.jobs WHERE id = shown.id LIMIT 1)
    AS job ON true
ORDER BY shown.direction, shown.id;

-- name: job_workflow_get
-- The graph around a job: the job, the jobs it depends on, directly or not (its
-- ancestors), and the jobs that depend on it (its descendants), each with its task,
-- queue and state (NULL: pruned, its link kept by a job that is not), and with the ids
-- of its dependencies among them (the edges). Each walk is breadth-first, and its UNION
-- visits each job once, so it ends on any graph (the enqueue cannot make a cycle, but
-- nothing here relies on that); its LIMIT stops it after the job and %(limit)s more,
-- nearest first, which bounds the depth as well as the breadth, since every level adds
-- a job. more_dependencies (of an ancestor) and more_dependents (of a descendant) count
-- the links that lead out of the graph: ancestors and descendants left out by a LIMIT.
-- Everything goes through the links' job_id index and primary key, and jobs by id.
WITH RECURSIVE ancestors (id) AS (
    SELECT %(id)s::bigint
    UNION
    SELECT link.depends_on FROM ancestors
    JOIN {schema}.job_dependencies AS link ON link.job_id = ancestors.id
),
descendants (id) AS (
    SELECT %(id)s::bigint
    UNION
    SELECT link.job_id FROM descendants
    JOIN {schema}.job_dependencies AS link ON link.depends_on = descendants.id
),
found AS MATERIALIZED (
    (SELECT id, true AS ancestor FROM ancestors LIMIT %(limit)s + 1)
    UNION ALL
    (SELECT id, false FROM descendants LIMIT %(limit)s + 1)
),
nodes AS MATERIALIZED (
    SELECT id, bool_or(ancestor) AS ancestor, bool_or(NOT ancestor) AS descendant
    FROM found GROUP BY id
)
SELECT nodes.id, job.task, job.queue, job.state::text AS state,
       ARRAY(SELECT link.depends_on FROM {schema}.job_dependencies AS link
             WHERE link.job_id = nodes.id AND link.depends_on IN (SELECT id FROM nodes)
             ORDER BY link.depends_on) AS depends_on,
       CASE WHEN nodes.ancestor THEN
           (SELECT count(*) FROM {schema}.job_dependencies AS link
            WHERE link.job_id = nodes.id AND link.depends_on NOT IN (SELECT id FROM nodes))
       ELSE 0 END AS more_dependencies,
       CASE WHEN nodes.descendant THEN
           (SELECT count(*) FROM {schema}.job_dependencies AS link
            WHERE link.depends_on = nodes.id AND link.job_id NOT IN (SELECT id FROM nodes))
       ELSE 0 END AS more_dependents
FROM nodes
-- One lookup by id per job, never a read of the history (see job_neighbours_get).
LEFT JOIN LATERAL (SELECT task, queue, state FROM {schema}.jobs WHERE id = nodes.id LIMIT 1)
    AS job ON true
ORDER BY nodes.id;
