-- New jobs wake only workers that wait for them.
--
-- Why: a transaction that has sent a notification takes a lock at commit that every
-- other notifying transaction of the whole cluster waits for, so a NOTIFY per enqueue
-- made concurrent producers commit one at a time. Most of those notifications woke
-- nobody: while a queue has a backlog its workers are busy claiming it, and when no
-- worker runs there is nobody to wake.
--
-- How: a worker whose claim came back short (it has free slots and found nothing more
-- to run) records that it waits on each of its queues, in the same statement as the
-- claim, and a claim that came back full takes the record back. The insert trigger
-- notifies a queue only while an unexpired record for it exists. A record expires
-- unless the worker's next claim renews it (each poll claims), so a worker that died
-- stops drawing notifications within a few poll intervals.
--
-- The record is read by the enqueuing statement, not at its commit: a job inserted
-- just before a worker's record is committed, and committed just after that worker's
-- claim, sends no notification; the worker finds it at its next poll. That poll is the
-- bound on a lost wake-up, as it was when the listening connection was down.
--
-- Unlogged: nothing in it must survive a crash. After one, the next claims record
-- their workers again.

CREATE UNLOGGED TABLE {schema}.waiting_workers (
    queue      text        NOT NULL,
    -- The worker, and which of its kinds of slots waits (see pgqueue_worker).
    waiter     text        NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (queue, waiter)
);

-- A claim that came back full takes back its waiter's records, by waiter.
CREATE INDEX waiting_workers_waiter_idx ON {schema}.waiting_workers (waiter);

CREATE OR REPLACE FUNCTION {schema}.notify_jobs_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '_jobs', q.queue)
    FROM (SELECT DISTINCT queue FROM inserted_jobs) AS q
    WHERE EXISTS (
        SELECT FROM {schema}.waiting_workers AS waiting
        WHERE waiting.queue = q.queue AND waiting.expires_at > now()
    );
    RETURN NULL;
END;
$$;
