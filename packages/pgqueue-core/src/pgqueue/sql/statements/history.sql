-- History: pruning finished jobs, and the day partitions of finished_jobs.
-- Placeholders and parameters: see pgqueue/queries.py.

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
