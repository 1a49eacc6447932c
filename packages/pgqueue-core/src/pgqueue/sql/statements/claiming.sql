-- Claiming: queued -> running under a lease, queue settings and fair share included, and
-- when a worker should look again.
-- Placeholders and parameters: see pgqueue/queries.py.

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
{_claimed},
waiting AS (
    INSERT INTO {schema}.queue_waiters (queue, waiter, expires_at)
    SELECT wanted.queue, %(waiter)s, now() + make_interval(secs => %(waiter_seconds)s)
    FROM unnest(%(queues)s::text[]) AS wanted (queue)
    WHERE %(waiter)s::text IS NOT NULL
      AND (SELECT count(*) FROM claimed) < %(limit)s
)
SELECT * FROM claimed;

-- name: _claimed
-- A fragment of job_claim and job_claim_limited (written {_claimed} there): the
-- UPDATE of the claimable jobs to running, and the removal of the claiming worker's
-- waiting rows. The CTE before it must be called claimable, with the ids to claim.
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
)

-- name: job_claim_limited
-- job_claim for queues that have settings (paused, throttled, or a concurrency or rate
-- limit of the queue or of its partition keys) or queued jobs with a partition key:
-- queued -> running for up to %(limit)s runnable jobs in claim order, as they allow.
--
-- Claim order (docs/operating-queues.md): priority first. Within one priority, the
-- jobs are taken round-robin across lanes, one job per lane per round: the jobs of
-- each partition key are a lane, and the jobs without a key are one more (of every
-- queue and task asked for, in priority, run_at, id order, as if they were one queue),
-- served first in each round. The keys follow each other in text order starting after
-- the key that the queue's previous claim served last (fair_share_cursors), wrapping
-- around, so the key served least recently comes first. Within a lane, run_at, then
-- id.
--
-- The lanes of keys come from a loose index scan of active_jobs_partition_claim_idx
-- (by priority, then key), one or two descents per lane, up to %(limit)s lanes that
-- may give a job now (a lane whose jobs are all delayed, or whose key is throttled, at
-- its concurrency limit or out of tokens, is passed over, and the walk goes on), and
-- at most 8 times that many lanes in all. Each lane then gives its share of the claim,
-- read in claim order from its index range: a claim reads a few index entries per job,
-- however long the backlog and however many keys it holds. When the shares come back
-- short, the lanes' next jobs make up the claim.
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
    -- Each source's lanes of jobs with a key, in claim order: a lane is the jobs of one
    -- key and one priority, the highest priority first, and within one priority the
    -- keys in turn order (after the queue's turn, then from the first key up to it).
    -- Each step of the walk is a descent or two of active_jobs_partition_claim_idx
    -- (lane_after), which also tells whether the lane has a job runnable now, and asks
    -- how many jobs of its key may start (partition_room, only for a queue that limits
    -- or throttles keys). The walk stops once it has found %(limit)s lanes that may give a job, or
    -- has walked 8 times that many.
    SELECT sources.queue, sources.task, walked.priority, walked.partition_key,
           walked.room, walked.tokens, walked.place
    FROM sources
    CROSS JOIN LATERAL (
        WITH RECURSIVE walk (priority, partition_key, wrapped, place, opened, room, tokens)
        AS (
            SELECT first.lane_priority, first.lane_key, first.lane_wrapped, 1,
                   (open.room > 0)::int, open.room, open.tokens
            FROM {schema}.lane_after(sources.queue, sources.task, sources.turn_after,
                                     NULL, NULL, false) AS first
            CROSS JOIN LATERAL (
                SELECT CASE WHEN first.lane_run_at <= now() THEN key_room.room ELSE 0 END
                           AS room,
                       key_room.tokens
                FROM (
                    SELECT * FROM {schema}.partition_room(
                        sources.queue, first.lane_key, sources.key_limit,
                        sources.key_rate, %(limit)s)
                    WHERE sources.keys_controlled
                    UNION ALL
                    SELECT %(limit)s::int, NULL::float8 WHERE NOT sources.keys_controlled
                ) AS key_room
            ) AS open
            UNION ALL
            SELECT next.lane_priority, next.lane_key, next.lane_wrapped, walk.place + 1,
                   walk.opened + (open.room > 0)::int, open.room, open.tokens
            FROM walk
            CROSS JOIN LATERAL {schema}.lane_after(
                sources.queue, sources.task, sources.turn_after, walk.priority,
                walk.partition_key, walk.wrapped) AS next
            CROSS JOIN LATERAL (
                SELECT CASE WHEN next.lane_run_at <= now() THEN key_room.room ELSE 0 END
                           AS room,
                       key_room.tokens
                FROM (
                    SELECT * FROM {schema}.partition_room(
                        sources.queue, next.lane_key, sources.key_limit,
                        sources.key_rate, %(limit)s)
                    WHERE sources.keys_controlled
                    UNION ALL
                    SELECT %(limit)s::int, NULL::float8 WHERE NOT sources.keys_controlled
                ) AS key_room
            ) AS open
            WHERE walk.place < 8 * %(limit)s AND walk.opened < %(limit)s
        )
        SELECT walk.priority, walk.partition_key, walk.room, walk.tokens, walk.place
        FROM walk
        WHERE walk.room > 0
    ) AS walked
),
keyless AS MATERIALIZED (
    -- Each source's jobs without a key, when it has one runnable now, with the
    -- priority of the best: a probe of active_jobs_claim_idx.
    SELECT sources.queue, sources.task, sources.room, head.priority
    FROM sources
    CROSS JOIN LATERAL (
        SELECT priority FROM {schema}.active_jobs
        WHERE state = 'queued'
          AND queue = sources.queue
          AND task = sources.task
          AND run_at <= now()
          AND partition_key IS NULL
        ORDER BY priority DESC, run_at, id
        LIMIT 1
    ) AS head
),
lanes AS MATERIALIZED (
    -- The lanes of keys, and each source's jobs without a key (place 0: first in every
    -- round), which count as one lane whatever the sources. A lane's share of the
    -- claim is the claim split evenly between the lanes of its priority and above (at
    -- most its room), so that the lanes of the highest priority offer enough jobs to
    -- fill the claim by themselves.
    SELECT keys.queue, keys.task, keys.priority, keys.partition_key, keys.room,
           keys.place,
           least(keys.room, ceil(%(limit)s::numeric / (
               count(*) OVER (ORDER BY keys.priority DESC RANGE UNBOUNDED PRECEDING)
               + (EXISTS (SELECT FROM keyless WHERE keyless.priority >= keys.priority))::int
           ))::int) AS share
    FROM keys
    UNION ALL
    SELECT keyless.queue, keyless.task, keyless.priority, NULL, keyless.room, 0,
           least(keyless.room, ceil(%(limit)s::numeric / (
               1 + (SELECT count(*) FROM keys WHERE keys.priority >= keyless.priority)
           ))::int)
    FROM keyless
),
taken AS (
    -- Each lane's share, its first jobs in claim order: a lane of a key reads its range
    -- of active_jobs_partition_claim_idx, the lane without a key its range of
    -- active_jobs_claim_idx (all its priorities).
    SELECT lanes.queue, lanes.task, lanes.partition_key, lanes.place,
           lanes.room AS lane_room, candidate.id, candidate.priority, candidate.run_at
    FROM lanes
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM {schema}.active_jobs
        WHERE state = 'queued'
          AND queue = lanes.queue
          AND task = lanes.task
          AND priority = lanes.priority
          AND partition_key = lanes.partition_key
          AND run_at <= now()
        ORDER BY run_at, id
        LIMIT lanes.share
        {lock}
    ) AS candidate
    WHERE lanes.partition_key IS NOT NULL
    UNION ALL
    SELECT lanes.queue, lanes.task, NULL, lanes.place, lanes.room, candidate.id,
           candidate.priority, candidate.run_at
    FROM lanes
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM {schema}.active_jobs
        WHERE state = 'queued'
          AND queue = lanes.queue
          AND task = lanes.task
          AND partition_key IS NULL
          AND run_at <= now()
        ORDER BY priority DESC, run_at, id
        LIMIT lanes.share
        {lock}
    ) AS candidate
    WHERE lanes.partition_key IS NULL
),
more AS (
    -- When the shares came back short (another claim holds some of their jobs, or a
    -- lane has fewer jobs than its share), the lanes' next jobs make up the claim, so
    -- that a claim comes back short only when there are no more jobs it may take.
    SELECT lanes.queue, lanes.task, lanes.partition_key, lanes.place,
           lanes.room AS lane_room, candidate.id, candidate.priority, candidate.run_at
    FROM lanes
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM {schema}.active_jobs
        WHERE state = 'queued'
          AND queue = lanes.queue
          AND task = lanes.task
          AND priority = lanes.priority
          AND partition_key = lanes.partition_key
          AND run_at <= now()
          AND id <> ALL(ARRAY(SELECT id FROM taken))
        ORDER BY run_at, id
        LIMIT greatest(0, least(lanes.room, %(limit)s - (SELECT count(*) FROM taken)))
        {lock}
    ) AS candidate
    WHERE lanes.partition_key IS NOT NULL
      AND (SELECT count(*) FROM taken) < (SELECT sum(share) FROM lanes)
    UNION ALL
    SELECT lanes.queue, lanes.task, NULL, lanes.place, lanes.room, candidate.id,
           candidate.priority, candidate.run_at
    FROM lanes
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM {schema}.active_jobs
        WHERE state = 'queued'
          AND queue = lanes.queue
          AND task = lanes.task
          AND partition_key IS NULL
          AND run_at <= now()
          AND id <> ALL(ARRAY(SELECT id FROM taken))
        ORDER BY priority DESC, run_at, id
        LIMIT greatest(0, least(lanes.room, %(limit)s - (SELECT count(*) FROM taken)))
        {lock}
    ) AS candidate
    WHERE lanes.partition_key IS NULL
      AND (SELECT count(*) FROM taken) < (SELECT sum(share) FROM lanes)
),
rounds AS (
    -- The round of a job with a key is its place in its lane; the jobs without a key,
    -- of every source, are one lane, in claim order (priority, run_at, id), as if they
    -- were one queue.
    SELECT candidate.*,
           row_number() OVER (PARTITION BY candidate.queue, candidate.task,
                                           candidate.partition_key, candidate.priority
                              ORDER BY candidate.run_at, candidate.id) AS round
    FROM (SELECT * FROM taken UNION ALL SELECT * FROM more) AS candidate
    WHERE candidate.partition_key IS NOT NULL
    UNION ALL
    SELECT candidate.*,
           row_number() OVER (PARTITION BY candidate.priority
                              ORDER BY candidate.run_at, candidate.id) AS round
    FROM (SELECT * FROM taken UNION ALL SELECT * FROM more) AS candidate
    WHERE candidate.partition_key IS NULL
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
{_claimed},
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
