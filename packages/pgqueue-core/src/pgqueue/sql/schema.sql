-- pgqueue's current schema: what `pgqueue migrate` creates in a new database.
--
-- A database created by an earlier version is brought here by the numbered upgrade
-- migrations in migrations/, applied in order; a test builds one database from this
-- file and one from migrations/0001_baseline.sql plus every upgrade, and requires the
-- two to be identical. Change this file and add an upgrade migration together.
--
-- {schema} is replaced by the quoted schema name.
--
-- Where jobs live:
-- - active_jobs holds the jobs that are not finished (queued, running). It is the only
--   table that claims, heartbeats and the reaper read or write, so it stays as small as
--   the backlog, however much history is kept.
-- - finished_jobs holds succeeded, dead and cancelled jobs. A job moves there in the
--   statement that finishes it (ack, last failure, cancel, reap), and back into
--   active_jobs when it is retried. It is partitioned by state, then by day of
--   finished_at, so that retention drops whole partitions (no DELETE, no dead rows).
-- - jobs is a view of both, for reading any job by id or listing them.

CREATE TYPE {schema}.job_state AS ENUM (
    'waiting',    -- for its dependencies to succeed; the ack of the last one queues it
    'queued',     -- runnable from run_at; moved in by enqueue, a failed attempt, the
                  -- reaper, retry, or the ack of a waiting job's last dependency
    'running',    -- claimed under a lease; moved out by ack, fail, cancel or the reaper
    'succeeded',  -- acked; final
    'dead',       -- failed max_attempts times; retry moves it back to queued
    'cancelled'   -- cancelled while waiting, queued or running, or its dependency failed;
                  -- retry moves it back to queued
);

-- Job ids, shared by both tables: a job keeps its id when it moves between them.
CREATE SEQUENCE {schema}.job_ids AS bigint;

CREATE TABLE {schema}.active_jobs (
    id               bigint PRIMARY KEY DEFAULT nextval('{schema}.job_ids'),
    queue            text NOT NULL,
    task             text NOT NULL,
    payload          jsonb NOT NULL,
    priority         smallint NOT NULL DEFAULT 0,
    state            {schema}.job_state NOT NULL DEFAULT 'queued'
                     CONSTRAINT active_jobs_state_check
                     CHECK (state IN ('waiting', 'queued', 'running')),
    run_at           timestamptz NOT NULL DEFAULT now(),
    attempts         integer NOT NULL DEFAULT 0,
    -- 5 is pgqueue.settings.DEFAULT_MAX_ATTEMPTS: keep them equal (pgqueue passes its
    -- own value; this one is for rows inserted by hand).
    max_attempts     integer NOT NULL DEFAULT 5 CHECK (max_attempts >= 1),
    timeout_seconds  double precision CHECK (timeout_seconds > 0),
    lease_token      uuid,
    lease_expires_at timestamptz,
    worker_id        text,
    enqueued_at      timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    last_error       text,
    result           jsonb,
    idempotency_key  text,
    -- The latest failed attempts, oldest first, at most 20: one object each with
    -- attempt, failed_at, worker_id and error (cut to 2,000 characters). NULL until an
    -- attempt fails: most jobs never do, and NULL costs nothing to store or read.
    errors           jsonb,
    -- The W3C trace context (traceparent, tracestate) of the span that enqueued the
    -- job, as OpenTelemetry's propagator wrote it, for the worker's span of each
    -- attempt to link to. NULL when the producer was not tracing.
    trace_context    jsonb,
    -- At most one queued or running job per unique key (active_jobs_unique_key_idx):
    -- a job that leaves this table frees its key. NULL for most jobs.
    unique_key       text,
    -- Jobs that wait for other jobs (see job_dependencies): how many of a waiting job's
    -- dependencies have not succeeded yet; the ack of the last one queues it. NULL for
    -- a job enqueued without dependencies.
    pending_dependencies integer,
    -- True once a job has been named as a dependency: its ack, death or cancellation
    -- then also releases or cancels its dependents. Written, as a row update, as the
    -- transaction that names it commits, so that an ack racing that commit waits for
    -- it and sees the flag (see dependents_checked).
    has_dependents   boolean NOT NULL DEFAULT false,
    -- Labels given on enqueue, at most 16 of at most 64 characters, each once, to find
    -- jobs by (active_jobs_tags_idx). NULL for a job enqueued without any.
    tags             text[],
    -- The latest progress the running handler reported (Job.progress), written at
    -- most every PROGRESS_INTERVAL by its worker, fenced by the lease: an object with
    -- fraction (0 to 1), message (text or null) and at (when it was written). NULL
    -- until a handler reports. Kept when the job finishes or is retried: it says how
    -- far the last attempt got.
    progress         jsonb,
    -- The tenant, customer or account the job is for (at most 200 characters, checked
    -- by pgqueue), or NULL. Claims take jobs with a key round-robin across keys (fair
    -- share), and a queue may limit how many jobs of one key run at once or start per
    -- second (queue_settings): see job_claim_limited.
    partition_key    text
) WITH (
    -- Every job is updated while it runs (claim, heartbeats). Heartbeats touch only
    -- lease_expires_at, which no index references, so they can be HOT updates that stay
    -- on the same page and add no index entries: keep 20% of each page free for them.
    fillfactor = 80,
    -- Every job passes through this table and leaves it: vacuum after 1% of it (plus a
    -- floor) has changed instead of the default 20%, so dead rows never pile up in the
    -- claim path, and do not let the vacuum's cost throttle make it fall behind.
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);

-- The claim path reads only queued rows, in claim order, per queue and task: a worker
-- claims only the tasks it serves, so a claim reads the jobs of those tasks and never
-- the backlog of others (see job_claim). Jobs without a partition key only: those with
-- one are in the next index, so that each lane of a fair-share claim (the jobs of one
-- key, or those without a key) is one index range in claim order, and every queued job
-- is in exactly one of the two.
CREATE INDEX active_jobs_claim_idx
    ON {schema}.active_jobs (queue, task, priority DESC, run_at, id)
    WHERE state = 'queued' AND partition_key IS NULL;

-- Queued jobs with a partition key, by priority, then key, then in claim order: a
-- claim walks the lanes (the jobs of one priority and key) one index descent each, a
-- loose index scan (lane_after), and takes each lane's next jobs from its range.
CREATE INDEX active_jobs_partition_claim_idx
    ON {schema}.active_jobs (queue, task, priority DESC, partition_key, run_at, id)
    WHERE state = 'queued' AND partition_key IS NOT NULL;

-- The running jobs of one key, counted by a claim of a queue with a
-- partition_concurrency_limit.
CREATE INDEX active_jobs_partition_running_idx
    ON {schema}.active_jobs (queue, partition_key)
    WHERE state = 'running' AND partition_key IS NOT NULL;

-- The reaper reads only running rows. lease_expires_at is deliberately not indexed
-- (see fillfactor above); the running set is as small as the workers' slots. By queue
-- first, so a claim of a queue with a concurrency limit counts that queue's running
-- jobs alone (see job_claim).
CREATE INDEX active_jobs_running_idx ON {schema}.active_jobs (queue, id)
    WHERE state = 'running';

-- Unique jobs: an enqueue whose unique key a queued or running job holds inserts
-- nothing (ON CONFLICT on this index) and returns that job instead. Only this table is
-- indexed: finishing a job moves it out, which frees its key without another write.
CREATE UNIQUE INDEX active_jobs_unique_key_idx ON {schema}.active_jobs (unique_key)
    WHERE unique_key IS NOT NULL;

-- Finding queued and running jobs by tag (GET /jobs?tag=) and by what their payload
-- contains (?payload_contains=, the @> operator), without reading the backlog. Only
-- tagged jobs are in the first. These are the only indexes that every enqueue, and
-- every claim and failed attempt (updates that change state, so not HOT), add entries
-- to beyond the b-trees; GIN's pending list (fastupdate) keeps each addition an
-- append, merged into the index by the frequent autovacuums of this table.
-- finished_jobs has neither: a search of history reads its partitions.
CREATE INDEX active_jobs_tags_idx ON {schema}.active_jobs USING gin (tags)
    WHERE tags IS NOT NULL;
CREATE INDEX active_jobs_payload_idx ON {schema}.active_jobs
    USING gin (payload jsonb_path_ops);

-- The same columns, in the same order, so a job moves with INSERT ... SELECT and the
-- jobs view is a plain UNION ALL. Partitioned by state (list), each state by day of
-- finished_at (range); see pgqueue.history for who creates and drops the days.
CREATE TABLE {schema}.finished_jobs (
    id               bigint NOT NULL,
    queue            text NOT NULL,
    task             text NOT NULL,
    payload          jsonb NOT NULL,
    priority         smallint NOT NULL,
    state            {schema}.job_state NOT NULL,
    run_at           timestamptz NOT NULL,
    attempts         integer NOT NULL,
    max_attempts     integer NOT NULL,
    timeout_seconds  double precision,
    lease_token      uuid,
    lease_expires_at timestamptz,
    worker_id        text,
    enqueued_at      timestamptz NOT NULL,
    started_at       timestamptz,
    finished_at      timestamptz NOT NULL,
    last_error       text,
    result           jsonb,
    idempotency_key  text,
    errors           jsonb,
    trace_context    jsonb,
    unique_key       text,           -- kept for history; held by no one once finished
    pending_dependencies integer,
    has_dependents   boolean NOT NULL DEFAULT false,
    tags             text[],
    progress         jsonb,
    partition_key    text
) PARTITION BY LIST (state);

-- Each state's days. A DEFAULT partition takes any row no day covers (a day not
-- created yet because no worker maintained the partitions, a finished_at set by hand),
-- so finishing a job never fails for want of a partition.
CREATE TABLE {schema}.finished_jobs_succeeded PARTITION OF {schema}.finished_jobs
    FOR VALUES IN ('succeeded') PARTITION BY RANGE (finished_at);
CREATE TABLE {schema}.finished_jobs_succeeded_default
    PARTITION OF {schema}.finished_jobs_succeeded DEFAULT;
CREATE TABLE {schema}.finished_jobs_dead PARTITION OF {schema}.finished_jobs
    FOR VALUES IN ('dead') PARTITION BY RANGE (finished_at);
CREATE TABLE {schema}.finished_jobs_dead_default
    PARTITION OF {schema}.finished_jobs_dead DEFAULT;
CREATE TABLE {schema}.finished_jobs_cancelled PARTITION OF {schema}.finished_jobs
    FOR VALUES IN ('cancelled') PARTITION BY RANGE (finished_at);
CREATE TABLE {schema}.finished_jobs_cancelled_default
    PARTITION OF {schema}.finished_jobs_cancelled DEFAULT;

-- Reading a job by id, and listing newest first. Not unique: a unique index on a
-- partitioned table must hold the partition keys; the sequence keeps ids unique.
CREATE INDEX finished_jobs_id_idx ON {schema}.finished_jobs (id);
-- Listing one queue's finished jobs, newest first.
CREATE INDEX finished_jobs_queue_idx ON {schema}.finished_jobs (queue, id);
-- The recent finished jobs (the dashboard's jobs finished per minute). BRIN: a few
-- bytes per range of pages, cheap for the acks that insert, and fit for day partitions
-- whose rows arrive in finished_at order; autosummarize keeps the ranges summarized.
CREATE INDEX finished_jobs_finished_at_idx ON {schema}.finished_jobs
    USING brin (finished_at) WITH (autosummarize = on);

-- Every job, wherever it is. Read-only: jobs change through pgqueue's statements.
CREATE VIEW {schema}.jobs AS
    SELECT * FROM {schema}.active_jobs
    UNION ALL
    SELECT * FROM {schema}.finished_jobs;

-- Which jobs wait for which (see pgqueue.dependencies): one row per dependency of a job
-- enqueued with depends_on, kept while the job is, for a job's page to show both
-- directions. A waiting job's count of unmet dependencies is on its row
-- (pending_dependencies); these rows say whose ack, death or cancellation changes it.
CREATE TABLE {schema}.job_dependencies (
    depends_on bigint NOT NULL,  -- the job waited for
    job_id     bigint NOT NULL,  -- the job that waits
    PRIMARY KEY (depends_on, job_id),
    -- Where depends_on named it, from 0: the order of the job's job.dependencies. NULL
    -- for links written before pgqueue kept it, which come after, by id.
    position   integer,
    -- The dependent's dependency_mode, the same on each of its rows: false
    -- ('succeeded') when this dependency must succeed, and its death or cancellation
    -- cancels the dependent; true ('finished') when it need only be final in any state,
    -- and its death or cancellation counts it off as its ack does.
    finished_mode boolean NOT NULL DEFAULT false
);

-- A job's own dependencies, and their removal when it is pruned.
CREATE INDEX job_dependencies_job_id_idx ON {schema}.job_dependencies (job_id);

-- The waiting jobs that a transaction enqueued or retried and whose dependencies it
-- has not checked yet (see dependents_checked): one row each, inserted by the
-- transaction and deleted by its check, at the latest as it commits, so the table is
-- empty to every other transaction. Unlogged: no row outlives its transaction.
CREATE UNLOGGED TABLE {schema}.dependents_to_check (
    job_id bigint PRIMARY KEY
);

-- Idempotency keys, held from enqueue until the job is pruned, wherever the job is:
-- a key cannot be unique across partitions and two tables any other way. Enqueue
-- inserts the key first, in the same statement as the job.
CREATE TABLE {schema}.idempotency_keys (
    key    text PRIMARY KEY,
    job_id bigint NOT NULL
);

-- How many finished jobs each queue holds, and how many attempts ever succeeded or
-- failed, written by the statements that finish, fail, retry and prune jobs (not by
-- triggers), so reading them costs the same however much history is kept. Each
-- transaction adds to a slot of its own (see counter_slot): concurrent writers never
-- wait for each other's row, and a reader sums the slots.
CREATE TABLE {schema}.queue_counters (
    queue     text NOT NULL,
    slot      smallint NOT NULL,
    succeeded bigint NOT NULL DEFAULT 0,  -- jobs now in finished_jobs, by state
    dead      bigint NOT NULL DEFAULT 0,
    cancelled bigint NOT NULL DEFAULT 0,
    completed bigint NOT NULL DEFAULT 0,  -- attempts that succeeded, ever
    failures  bigint NOT NULL DEFAULT 0,  -- attempts that failed or expired, ever
    PRIMARY KEY (queue, slot)
);

-- The slot of queue_counters, run_time_buckets and pickup_buckets that the calling
-- transaction adds to: one that no other open transaction is adding to, held by a
-- transaction-scoped advisory lock (in the two-key space, the first key naming the
-- schema), the backend's own (its pid modulo 16) when free. A counting statement that
-- waited for another transaction's slot row could close a deadlock: the statements that
-- count lock the jobs they change first, so a transaction that has counted (holding a
-- slot's row) and then waits for a job could be waited for by the holder of that job,
-- about to count in the same slot. Only when all 16 slots are held by open
-- transactions does it fall back to its own, and may wait. Called again in the same
-- transaction it returns a slot that transaction holds.
CREATE FUNCTION {schema}.counter_slot() RETURNS smallint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    own constant integer := mod(pg_backend_pid(), 16);
    space constant integer := hashtext('{schema}.counter_slot');
BEGIN
    FOR step IN 0..15 LOOP
        IF pg_try_advisory_xact_lock(space, mod(own + step, 16)) THEN
            RETURN mod(own + step, 16);
        END IF;
    END LOOP;
    RETURN own;
END
$$;

-- Run times of the attempts that succeeded, per queue and task, as the buckets of a
-- histogram: the seconds from claim to ack on the database clock (started_at to
-- finished_at), counted by job_finish_many in the same statement, so /metrics reads a
-- few rows per queue and task however much history is kept. le is the bucket's upper
-- bound (see run_time_bounds; 'Infinity' for the last); attempts and seconds are that
-- bucket's, not cumulative. Slots as in queue_counters.
CREATE TABLE {schema}.run_time_buckets (
    queue    text NOT NULL,
    task     text NOT NULL,
    le       double precision NOT NULL,
    slot     smallint NOT NULL,
    attempts bigint NOT NULL DEFAULT 0,
    seconds  double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, task, le, slot)
);

-- The upper bounds of run_time_buckets, in seconds, ascending; 'Infinity' is the last.
CREATE FUNCTION {schema}.run_time_bounds() RETURNS double precision[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900,
                 3600, 'Infinity']::float8[]
$$;

-- How long attempts waited to start, per queue, as the buckets of a histogram: the
-- seconds from when the job became runnable (pickup_seconds) to its claim, on the
-- database clock. The statement that ends an attempt, which still holds both times,
-- counts it here: job_finish_many (ack, failure, reap) and job_cancel. The attempts
-- running now are counted from their rows when the histogram is read
-- (pickup_histogram), so it holds one observation per attempt started, by any worker,
-- while the claim, the statement a pickup waits for, writes nothing more. le, slot,
-- attempts and seconds as in run_time_buckets.
CREATE TABLE {schema}.pickup_buckets (
    queue    text NOT NULL,
    le       double precision NOT NULL,
    slot     smallint NOT NULL,
    attempts bigint NOT NULL DEFAULT 0,
    seconds  double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, le, slot)
);

-- The upper bounds of pickup_buckets, in seconds, ascending; 'Infinity' is the last.
CREATE FUNCTION {schema}.pickup_bounds() RETURNS double precision[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
                 900, 3600, 'Infinity']::float8[]
$$;

-- An attempt's wait to start, in seconds: from when its job became runnable, the later
-- of its enqueue and its run_at (which a failed attempt, the reaper and retry move to
-- when it may run again), to started_at, its claim. Never negative; 0 for a row
-- without those times (written around pgqueue).
CREATE FUNCTION {schema}.pickup_seconds(
    started_at timestamptz, enqueued_at timestamptz, run_at timestamptz
) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(0, date_part('epoch', started_at - greatest(enqueued_at, run_at)))
$$;

-- The workers that may be waiting for jobs, per queue: a LISTENing worker whose last
-- claim came back short, until its next claim or expires_at (see job_claim). Only
-- enqueues and retries into these queues notify (see job_insert in queries.sql): a
-- NOTIFY takes a lock at commit that serialises every notifying transaction of the
-- server, which producers then pay only while a worker waits. Unlogged: it is rewritten every poll interval, and a worker's next
-- claim writes it again after a crash or a failover has emptied it.
CREATE UNLOGGED TABLE {schema}.queue_waiters (
    queue      text NOT NULL,
    waiter     text NOT NULL,
    expires_at timestamptz NOT NULL
);

CREATE INDEX queue_waiters_queue_idx ON {schema}.queue_waiters (queue, expires_at);
CREATE INDEX queue_waiters_waiter_idx ON {schema}.queue_waiters (waiter);

-- The jobs that someone waits for to finish (Queue.wait, GET /jobs/ID?wait=S): one
-- row per job and waiting process (waiter, its watcher's name), valid until
-- expires_at, which the watcher renews while it waits and deletes when it stops;
-- rows left by a process that died expire, and job_waiters_expired_delete removes
-- them. A statement that finishes jobs (job_finish_many, job_cancel,
-- job_dependents_cancel, dependents_checked) notifies the schema's "done" channel
-- (pgqueue.settings.done_channel) with the id of each finished job found here, and
-- only those: when nobody waits, which is nearly always, that costs one look at an
-- empty index, never a NOTIFY (whose lock at commit would serialise the acks).
-- Unlogged, as queue_waiters: a watcher registers its jobs again whenever it
-- reconnects, and reads their states then.
CREATE UNLOGGED TABLE {schema}.job_waiters (
    job_id     bigint NOT NULL,
    waiter     text NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (job_id, waiter)
);

CREATE INDEX job_waiters_expires_at_idx ON {schema}.job_waiters (expires_at);

-- What an operator set for a queue: paused, a concurrency limit (jobs running at once
-- across every worker) and a rate limit (jobs started per second across every worker).
-- Only queues with settings have a row: a claim reads this table's primary key for the
-- queues it asks for, and a queue with no row pays nothing more. A claim of a limited
-- queue first locks its row (see job_claim_lock), so such claims take turns and each
-- counts the running jobs the one before it committed. tokens and tokens_at are the
-- rate limit's token bucket, refilled at rate_limit per second up to a tenth of a
-- second's worth (at least one job), and spent by those claims.
CREATE TABLE {schema}.queue_settings (
    queue             text PRIMARY KEY,
    paused            boolean NOT NULL DEFAULT false,
    concurrency_limit integer CHECK (concurrency_limit >= 0),
    rate_limit        double precision
                      CHECK (rate_limit > 0 AND rate_limit < 'Infinity'::double precision),
    tokens            double precision NOT NULL DEFAULT 0,
    tokens_at         timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    -- Per partition key of this queue: jobs of one key running at once, and jobs of one
    -- key started per second (each key's bucket is in partition_controls). Jobs without
    -- a key are bound by the queue-wide limits only.
    partition_concurrency_limit integer CHECK (partition_concurrency_limit >= 0),
    partition_rate_limit        double precision
                                CHECK (partition_rate_limit > 0
                                       AND partition_rate_limit < 'Infinity'::double precision),
    -- No job of this queue starts before this time: a handler's Throttle(scope="queue"),
    -- or an operator's. Kept after it passes (it then holds nothing).
    throttled_until   timestamptz
);

-- Each partition key's own controls, for the keys that have any: the token bucket of
-- the queue's partition_rate_limit (as queue_settings' bucket, NULL until the key's
-- first claim under a rate: a key starts with a full bucket), and a throttle until
-- which no job of the key starts (a handler's Throttle(scope="partition")). Written by
-- claims of a rate-limited queue (under its row lock) and by throttles; a row that
-- holds nothing any more (its throttle passed, its bucket full again) is deleted by
-- the reaper, which changes nothing: the key's next claim finds what a new key would.
CREATE TABLE {schema}.partition_controls (
    queue           text NOT NULL,
    partition_key   text NOT NULL,
    tokens          double precision,
    tokens_at       timestamptz,
    throttled_until timestamptz,
    PRIMARY KEY (queue, partition_key)
);

-- The lane of queued jobs with a partition key (one priority, one key) that comes
-- after the lane (priority, partition_key) in fair-share order, for one queue and task
-- whose turn stands at turn: the next key of the same priority in text order, up to
-- the end and then, wrapped, from the first key up to the turn; then the next lower
-- priority's first key after the turn (or its first key). NULL priority and key: the
-- first lane. No row: no lane after it. lane_run_at is when the lane's first job is
-- due (its earliest: the index orders a lane by run_at), so whether the lane has a job
-- runnable now comes with it. Each branch is one descent of
-- active_jobs_partition_claim_idx, and the branches are tried in order until one
-- finds a lane. Called by job_claim_limited's walk.
CREATE FUNCTION {schema}.lane_after(
    queue text, task text, turn text, priority smallint, partition_key text,
    wrapped boolean)
RETURNS TABLE (lane_priority smallint, lane_key text, lane_wrapped boolean,
              lane_run_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT found.priority, found.partition_key, found.wrapped, found.run_at
    FROM (
        -- The next key of the same priority, before the walk wrapped...
        (SELECT job.priority, job.partition_key, false AS wrapped, job.run_at
         FROM {schema}.active_jobs AS job
         WHERE job.state = 'queued' AND job.partition_key IS NOT NULL
           AND job.queue = lane_after.queue AND job.task = lane_after.task
           AND job.priority = lane_after.priority
           AND NOT lane_after.wrapped
           AND job.partition_key > lane_after.partition_key
         ORDER BY job.partition_key, job.run_at, job.id
         LIMIT 1)
        UNION ALL
        -- ...or after, up to the turn. Every condition on the row is a bound of the
        -- index scan, and the ones on the arguments alone decide whether the branch
        -- runs at all: a condition such as "NOT wrapped OR key <= turn" would be a
        -- filter, and its scan would read every queued job of the keys past the turn.
        (SELECT job.priority, job.partition_key, true, job.run_at
         FROM {schema}.active_jobs AS job
         WHERE job.state = 'queued' AND job.partition_key IS NOT NULL
           AND job.queue = lane_after.queue AND job.task = lane_after.task
           AND job.priority = lane_after.priority
           AND lane_after.wrapped
           AND job.partition_key > lane_after.partition_key
           AND job.partition_key <= lane_after.turn
         ORDER BY job.partition_key, job.run_at, job.id
         LIMIT 1)
        UNION ALL
        -- Wrapping: the first key of the same priority, up to the turn.
        (SELECT job.priority, job.partition_key, true, job.run_at
         FROM {schema}.active_jobs AS job
         WHERE job.state = 'queued' AND job.partition_key IS NOT NULL
           AND job.queue = lane_after.queue AND job.task = lane_after.task
           AND job.priority = lane_after.priority
           AND NOT lane_after.wrapped AND job.partition_key <= lane_after.turn
         ORDER BY job.partition_key, job.run_at, job.id
         LIMIT 1)
        UNION ALL
        -- The next lower priority (the highest, for the first lane), from its first
        -- key after the turn, or its first key.
        (SELECT lower.priority, first.partition_key, first.wrapped, first.run_at
         FROM (
             SELECT candidate.priority
             FROM (
                 (SELECT job.priority
                  FROM {schema}.active_jobs AS job
                  WHERE job.state = 'queued' AND job.partition_key IS NOT NULL
                    AND job.queue = lane_after.queue AND job.task = lane_after.task
                    AND lane_after.priority IS NULL
                  ORDER BY job.priority DESC
                  LIMIT 1)
                 UNION ALL
                 (SELECT job.priority
                  FROM {schema}.active_jobs AS job
                  WHERE job.state = 'queued' AND job.partition_key IS NOT NULL
                    AND job.queue = lane_after.queue AND job.task = lane_after.task
                    AND job.priority < lane_after.priority
                  ORDER BY job.priority DESC
                  LIMIT 1)
             ) AS candidate
             LIMIT 1
         ) AS lower
         CROSS JOIN LATERAL (
             SELECT starting.partition_key, starting.wrapped, starting.run_at
             FROM (
                 (SELECT job.partition_key, false AS wrapped, job.run_at
                  FROM {schema}.active_jobs AS job
                  WHERE job.state = 'queued' AND job.partition_key IS NOT NULL
                    AND job.queue = lane_after.queue AND job.task = lane_after.task
                    AND job.priority = lower.priority
                    AND job.partition_key > coalesce(lane_after.turn, '')
                  ORDER BY job.partition_key, job.run_at, job.id
                  LIMIT 1)
                 UNION ALL
                 (SELECT job.partition_key, true, job.run_at
                  FROM {schema}.active_jobs AS job
                  WHERE job.state = 'queued' AND job.partition_key IS NOT NULL
                    AND job.queue = lane_after.queue AND job.task = lane_after.task
                    AND job.priority = lower.priority
                    AND job.partition_key <= lane_after.turn
                  ORDER BY job.partition_key, job.run_at, job.id
                  LIMIT 1)
             ) AS starting
             LIMIT 1
         ) AS first)
    ) AS found
    LIMIT 1
$$;

-- How many jobs of one partition key may start now, at most wanted: none while the key
-- is throttled, else what the queue's partition_concurrency_limit leaves beside the
-- key's running jobs (counted, never kept as a counter that could drift) and what its
-- bucket holds under partition_rate_limit (NULL limits bind nothing). tokens is the
-- bucket refilled to now (NULL without a rate), for the claim to spend. Called by
-- job_claim_limited for each key it walks.
CREATE FUNCTION {schema}.partition_room(
    queue text, partition_key text, concurrency_limit integer,
    rate_limit double precision, wanted integer,
    OUT room integer, OUT tokens double precision)
LANGUAGE sql VOLATILE AS $$
    SELECT CASE
               WHEN control.throttled_until > clock_timestamp() THEN 0
               ELSE least(
                   wanted,
                   CASE WHEN concurrency_limit IS NOT NULL THEN greatest(0,
                       concurrency_limit - (
                           SELECT count(*) FROM {schema}.active_jobs AS job
                           WHERE job.state = 'running' AND job.queue = $1
                             AND job.partition_key = $2))::int
                   END,
                   floor(bucket.tokens)::int)
           END,
           bucket.tokens
    FROM (SELECT) AS one
    LEFT JOIN {schema}.partition_controls AS control
           ON control.queue = $1 AND control.partition_key = $2
    LEFT JOIN LATERAL (
        SELECT least(greatest(1, rate_limit / 10),
                     coalesce(control.tokens, greatest(1, rate_limit / 10))
                     + rate_limit * greatest(0, extract(epoch FROM
                         clock_timestamp() - coalesce(control.tokens_at, clock_timestamp()))))
                   AS tokens
        WHERE rate_limit IS NOT NULL
    ) AS bucket ON true
$$;

-- Where each queue's fair share stands: the partition key its latest claim served
-- last. The next claim starts after it in text order, so that keys take turns across
-- claims, and across workers (see job_claim_limited). Written by claims that took jobs
-- with a key, without ever waiting: a claim that finds the row held by another leaves
-- it to that one. Unlogged: lost in a crash, the turns start again from the first key.
CREATE UNLOGGED TABLE {schema}.fair_share_cursors (
    queue         text PRIMARY KEY,
    partition_key text NOT NULL
);

-- The workers running now: each `pgqueue worker` inserts its row when it starts,
-- renews it with every heartbeat (an idle worker still beats) and deletes it when it
-- stops. A row whose expires_at has passed is a worker that died: it no longer counts,
-- and the reaper deletes it. Unlogged, as queue_waiters: a worker's next heartbeat
-- writes its row again after a crash or a failover has emptied the table.
CREATE UNLOGGED TABLE {schema}.workers (
    id           text PRIMARY KEY,
    host         text NOT NULL,
    pid          integer NOT NULL,
    version      text NOT NULL,
    queues       text[] NOT NULL,
    tasks        text[] NOT NULL,
    concurrency  integer NOT NULL,
    started_at   timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL
);

-- Since when this server has kept the worker registry: one row, written again by the
-- first worker to register or beat after the registry was lost. Unlogged, as workers:
-- whatever empties workers (crash recovery, a standby promoted) empties this too. A
-- clean restart keeps both, with worker rows that expired while the server was down:
-- server_started, the postmaster's start when the row was written, tells that row
-- apart. Until every live worker has had time to write its row again, the registry
-- cannot tell that no worker serves a task (see tasks_unserved), so the API's
-- --reject-unserved-tasks refuses nothing. A new schema's registry is complete: no
-- worker ever ran on it.
CREATE UNLOGGED TABLE {schema}.workers_kept_since (
    one            boolean PRIMARY KEY DEFAULT true CHECK (one),
    since          timestamptz NOT NULL,
    server_started timestamptz NOT NULL
);

INSERT INTO {schema}.workers_kept_since (since, server_started)
VALUES ('-infinity', pg_postmaster_start_time());

-- Periodic jobs (see pgqueue.schedules): one row per schedule a plugin declared,
-- written by each worker's sync when it starts and by the operator's enable and
-- disable. Rows are never deleted: a schedule its plugin no longer declares gets
-- removed_at and is disabled (disabled_by 'sync'), and comes back enabled if declared
-- again; one the operator disabled (disabled_by 'operator') stays so across restarts
-- and redefinitions. The scheduler enqueues one job per tick: under an advisory lock,
-- in one transaction, it enqueues for each enabled row whose next_run_at has come (an
-- idempotency key of name and tick) and moves next_run_at to the first tick after the
-- database's now, so ticks missed while no scheduler ran make one run, not a stampede.
CREATE TABLE {schema}.schedules (
    name         text PRIMARY KEY,
    cron         text NOT NULL,
    timezone     text NOT NULL,
    task         text NOT NULL,
    queue        text NOT NULL,
    payload      jsonb NOT NULL,
    priority     smallint NOT NULL,
    max_attempts integer CHECK (max_attempts >= 1),  -- NULL: the jobs' default
    source       text NOT NULL,                      -- the plugin that declares it
    enabled      boolean NOT NULL DEFAULT true,
    disabled_by  text CHECK (disabled_by IN ('operator', 'sync')),
    removed_at   timestamptz,
    next_run_at  timestamptz,                        -- NULL while disabled
    last_run_at  timestamptz,                        -- when its last job was enqueued
    last_tick_at timestamptz,                        -- the tick that job was for
    last_job_id  bigint,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    -- Why the scheduler skips the row, as the last round that looked at it found: a time
    -- zone, cron expression or payload it cannot read (written by another version, or
    -- by hand). next_run_at is then when a round looks at it again. NULL while it runs.
    error        text
);

-- A job's error history with one more failed attempt, the last 20 kept, each error cut
-- to 2,000 characters, so a job that fails forever stays a row of bounded size.
CREATE FUNCTION {schema}.errors_appended(
    errors jsonb, attempt integer, worker_id text, error text
) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_path_query_array(
        coalesce(errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
            'attempt', attempt, 'failed_at', now(), 'worker_id', worker_id,
            'error', left(error, 2000))),
        '$[last - 19 to last]')
$$;

-- The waiting jobs that depend on the jobs in acked (just acked, by the calling
-- statement) count them off their pending dependencies, and the ones left with none
-- become queued, waking their queues' workers on channel (see job_finish_many, the only
-- caller). Returns how many became queued. Volatile, so its statement takes a new
-- snapshot: it sees the dependency rows of an enqueue that the calling ack waited for.
-- Two acks of a job's last two dependencies take turns on its row, and the second one
-- counts from what the first left, so the job is queued exactly once.
CREATE FUNCTION {schema}.dependents_released(acked bigint[], channel text) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    WITH met AS (
        SELECT dependency.job_id, count(*)::int AS jobs
        FROM {schema}.job_dependencies AS dependency
        WHERE dependency.depends_on = ANY(acked)
        GROUP BY dependency.job_id
    ),
    released AS (
        UPDATE {schema}.active_jobs AS job
        SET pending_dependencies = job.pending_dependencies - met.jobs,
            state = CASE WHEN job.pending_dependencies - met.jobs <= 0 THEN 'queued'
                         ELSE 'waiting' END::{schema}.job_state
        FROM met
        WHERE job.id = met.job_id AND job.state = 'waiting'
        RETURNING job.id, job.queue, job.state
    ),
    woken AS (
        SELECT pg_notify(channel, wanted.queue)
        FROM (SELECT DISTINCT queue FROM released WHERE state = 'queued') AS wanted
        WHERE EXISTS (
            SELECT FROM {schema}.queue_waiters AS waiter
            WHERE waiter.queue = wanted.queue AND waiter.expires_at > now()
        )
    )
    SELECT count(*) FILTER (WHERE state = 'queued') FROM released
    WHERE (SELECT count(*) FROM woken) >= 0
$$;

-- Dependents in 'finished' mode counted again, by the statements of a producer's cancel
-- and retry (job_dependents_cancel, job_retry), which may not change jobs' states
-- themselves (see ../roles.py): this runs as the schema's owner. Each of job_ids still
-- waiting adds changes[i] to its pending dependencies: a dependency that ended dead or
-- cancelled counts off (-1 each), one retried is waited for again (+1); one left with
-- none is queued. Those changed come back. A row update, as in dependents_released: an
-- ack and a death of a job's last two dependencies take turns on its row, and exactly
-- one of them queues it.
CREATE FUNCTION {schema}.finished_dependents_recounted(job_ids bigint[], changes integer[])
RETURNS SETOF {schema}.active_jobs
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    UPDATE {schema}.active_jobs AS job
    SET pending_dependencies = job.pending_dependencies + counted.change,
        state = CASE WHEN job.pending_dependencies + counted.change <= 0 THEN 'queued'
                     ELSE 'waiting' END::{schema}.job_state
    FROM unnest(job_ids, changes) AS counted (job_id, change)
    WHERE job.id = counted.job_id AND job.state = 'waiting'
    RETURNING job.*
$$;

-- Checks the dependencies of the waiting jobs this transaction enqueued or retried
-- (its rows of dependents_to_check), which the enqueue read without locking anything:
-- called by the trigger below as the transaction commits, or by pgqueue just before it
-- commits a transaction of its own. fired_by is the row whose trigger calls it: the
-- first firing checks every job of the transaction, the later ones find theirs gone.
--
-- 1. Each dependency still in active_jobs is locked, in id order (so two commits, or a
--    commit and an ack that releases a dependent, never wait for each other in a
--    cycle: a dependent's id is always above its dependencies'), and marked as having
--    dependents. An ack, failure or cancel of it under way is waited for; one that
--    comes later waits for this commit, then reads the mark and finds these jobs. The
--    lock is held from here to the commit, never through the producer's transaction.
-- 2. Each statement of a volatile function takes a new snapshot, so the next ones see
--    whatever those waits let commit. The jobs with a dependency that ended dead or
--    cancelled are cancelled, with their dependents among these jobs in turn, unless
--    they wait in 'finished' mode (finished_mode), for which an end in any state is
--    met; every other one's count of unmet dependencies (those still in active_jobs) is set from
--    scratch, and one with none left is queued, waking its queue's waiting workers on
--    channel. The enqueue's own count was provisional: nothing is counted twice.
--
-- Returns the jobs whose state or count it changed. Runs as the schema's owner: a
-- producer may not change a job's state by itself.
CREATE FUNCTION {schema}.dependents_checked(channel text, fired_by bigint DEFAULT NULL)
RETURNS TABLE (job_id bigint, state text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    checking bigint[];
    ended bigint;
BEGIN
    IF fired_by IS NOT NULL AND NOT EXISTS (
        SELECT FROM {schema}.dependents_to_check AS unchecked
        WHERE unchecked.job_id = fired_by
    ) THEN
        RETURN;
    END IF;
    WITH taken AS (
        DELETE FROM {schema}.dependents_to_check AS unchecked RETURNING unchecked.job_id
    )
    SELECT array_agg(taken.job_id) INTO checking FROM taken;
    IF checking IS NULL THEN
        RETURN;
    END IF;

    UPDATE {schema}.active_jobs AS dependency
    SET has_dependents = true
    WHERE dependency.id = ANY(ARRAY(
        SELECT job.id FROM {schema}.active_jobs AS job
        WHERE job.id IN (SELECT link.depends_on FROM {schema}.job_dependencies AS link
                         WHERE link.job_id = ANY(checking))
        ORDER BY job.id
        FOR NO KEY UPDATE OF job
    ))
      AND NOT dependency.has_dependents;

    LOOP
        RETURN QUERY
        WITH doomed AS (
            SELECT DISTINCT ON (link.job_id)
                   link.job_id,
                   'dependency ' || link.depends_on || ' ended ' || failed.state AS reason
            FROM {schema}.job_dependencies AS link
            JOIN {schema}.finished_jobs AS failed ON failed.id = link.depends_on
            WHERE link.job_id = ANY(checking) AND failed.state IN ('dead', 'cancelled')
              AND NOT link.finished_mode
            ORDER BY link.job_id, link.depends_on
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
                 timeout_seconds, worker_id, enqueued_at, started_at, finished_at,
                 last_error, result, idempotency_key, errors, trace_context, unique_key,
                 pending_dependencies, has_dependents,
                 tags, progress, partition_key)
            SELECT cancelled.id, cancelled.queue, cancelled.task, cancelled.payload,
                   cancelled.priority, 'cancelled', cancelled.run_at, cancelled.attempts,
                   cancelled.max_attempts, cancelled.timeout_seconds, cancelled.worker_id,
                   cancelled.enqueued_at, cancelled.started_at, clock_timestamp(),
                   cancelled.reason, cancelled.result, cancelled.idempotency_key,
                   cancelled.errors, cancelled.trace_context, cancelled.unique_key,
                   cancelled.pending_dependencies, cancelled.has_dependents,
                   cancelled.tags, cancelled.progress, cancelled.partition_key
            FROM cancelled
            RETURNING finished_jobs.id
        ),
        counted AS (
            INSERT INTO {schema}.queue_counters AS counter (queue, slot, cancelled)
            SELECT cancelled.queue, {schema}.counter_slot(), count(*) FROM cancelled
            GROUP BY cancelled.queue ORDER BY cancelled.queue
            ON CONFLICT (queue, slot)
            DO UPDATE SET cancelled = counter.cancelled + excluded.cancelled
        ),
        watched AS (
            -- The cancelled jobs that someone waits for (see job_waiters), announced by
            -- id on the done channel, as job_finish_many announces those it finishes.
            SELECT pg_notify(channel || '_done', moved.id::text)
            FROM moved
            WHERE EXISTS (SELECT FROM {schema}.job_waiters)
              AND EXISTS (SELECT FROM {schema}.job_waiters AS waiter
                          WHERE waiter.job_id = moved.id)
        )
        SELECT moved.id, 'cancelled'::text FROM moved
        WHERE (SELECT count(*) FROM watched) >= 0;
        GET DIAGNOSTICS ended = ROW_COUNT;
        EXIT WHEN ended = 0;
    END LOOP;

    RETURN QUERY
    WITH unmet AS (
        SELECT link.job_id, count(dependency.id)::integer AS jobs
        FROM {schema}.job_dependencies AS link
        LEFT JOIN {schema}.active_jobs AS dependency ON dependency.id = link.depends_on
        WHERE link.job_id = ANY(checking)
        GROUP BY link.job_id
    ),
    counted AS (
        UPDATE {schema}.active_jobs AS job
        SET pending_dependencies = unmet.jobs,
            state = (CASE WHEN unmet.jobs > 0 THEN 'waiting' ELSE 'queued' END)::{schema}.job_state
        FROM unmet
        WHERE job.id = unmet.job_id AND job.state = 'waiting'
          AND (job.pending_dependencies IS DISTINCT FROM unmet.jobs OR unmet.jobs = 0)
        RETURNING job.id, job.queue, job.state
    ),
    woken AS (
        SELECT pg_notify(channel, wanted.queue)
        FROM (SELECT DISTINCT counted.queue FROM counted WHERE counted.state = 'queued')
             AS wanted
        WHERE EXISTS (
            SELECT FROM {schema}.queue_waiters AS waiter
            WHERE waiter.queue = wanted.queue AND waiter.expires_at > now()
        )
    )
    SELECT counted.id, counted.state::text FROM counted
    WHERE (SELECT count(*) FROM woken) >= 0;
END
$$;

-- Checks the waiting jobs of a transaction as it commits (see dependents_checked), on
-- the schema's channel as pgqueue.settings.notify_channel names it.
CREATE FUNCTION {schema}.dependents_check_at_commit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {schema}.dependents_checked(TG_TABLE_SCHEMA || '_jobs', NEW.job_id);
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER dependents_check_at_commit
    AFTER INSERT ON {schema}.dependents_to_check
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION {schema}.dependents_check_at_commit();

-- The time a claim starts its jobs: their started_at, and the start of their lease.
-- The clock when first asked in a transaction, kept for the rest of it in a setting
-- local to the transaction, so job_claim_times reads back what the claim wrote. The
-- claim asks while its statement runs, after its snapshot was taken: later than the
-- commit of whatever made its jobs runnable (the ack that released a waiting job, say),
-- where the transaction's now() may be earlier. Kept as text in UTC, which reads back
-- the same whatever the session's DateStyle and TimeZone.
CREATE FUNCTION {schema}.claim_clock() RETURNS timestamptz
LANGUAGE sql VOLATILE AS $$
    SELECT coalesce(
        nullif(current_setting('pgqueue.claim_clock', true), '')::timestamp
            AT TIME ZONE 'UTC',
        set_config('pgqueue.claim_clock',
                   to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'),
                   true)::timestamp AT TIME ZONE 'UTC')
$$;
