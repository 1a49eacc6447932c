-- Each job keeps the errors of its latest failed attempts, not only the last one.
--
-- errors is a JSON array, oldest first, of one object per failed attempt (a handler
-- that raised or timed out, a result that could not be stored, a lease that expired)
-- with the keys attempt (its number), failed_at (when it was recorded), worker_id (the
-- worker that had claimed it) and error (the text last_error was set to).
-- job_fail and job_reap append to it in the UPDATE that records the failure, keeping
-- the last 20 entries, each error cut to 2,000 characters, so a job that fails forever
-- stays a row of bounded size. An ack leaves it as it is (and clears last_error).
--
-- NULL means no attempt has failed yet: most jobs never fail, and a NULL costs no
-- space in the row and nothing to read back, where an empty array would be decoded
-- on every claim and enqueue. pgqueue.Job.errors reads it as an empty list.
--
-- Adding a column without a default rewrites nothing: the table is not locked for
-- longer than the catalog change. No index covers the column, so heartbeats stay HOT
-- updates, and the rollup triggers (0002-0005) read only queue, state and times from
-- their transition tables, so they are unaffected.

ALTER TABLE {schema}.jobs ADD COLUMN errors jsonb;
