-- The audit trail a run of the fault scenarios or of the soak is judged by
-- (pgqueue_bench.verdict.audit). It is no part of pgqueue: a test instrument installed on a run's
-- schema after `pgqueue migrate`.
--
-- Placeholders: {schema} is the quoted schema of the run. Parameters use psycopg's
-- %(name)s style.

-- name: audit_install
-- Every change of a job's state, written by a trigger in the same transaction as the
-- change, with the lease token the job held before it: an ack that committed is in
-- here exactly once, whatever crashed or failed over around it. Kept in the default
-- tablespace, so a full disk under the jobs table does not also fill the audit.
CREATE TABLE {schema}.job_audit (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      bigint NOT NULL,
    queue       text,
    from_state  text,
    to_state    text NOT NULL,
    lease_token uuid,
    attempts    integer,
    run_at      timestamptz,
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
) TABLESPACE pg_default;

-- Within active_jobs: claims (queued -> running), failed attempts and reaps that come
-- back (running -> queued), dependencies met (waiting -> queued).
CREATE FUNCTION {schema}.job_audit_record_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.job_audit
        (job_id, queue, from_state, to_state, lease_token, attempts, run_at)
    SELECT new_row.id, new_row.queue, old_row.state::text, new_row.state::text,
           old_row.lease_token, new_row.attempts, new_row.run_at
    FROM audit_before AS old_row JOIN audit_after AS new_row USING (id)
    WHERE old_row.state <> new_row.state;
    RETURN NULL;
END;
$$;

CREATE TRIGGER job_audit_update
    AFTER UPDATE ON {schema}.active_jobs
    REFERENCING OLD TABLE AS audit_before NEW TABLE AS audit_after
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.job_audit_record_update();

-- A job leaving one table: finished (into finished_jobs, in the same statement), retried
-- (back into active_jobs), or deleted for good (pruned, or an enqueue taken back). An
-- after-statement trigger sees what the whole statement wrote, so where the job went is
-- known here. A whole day's partition dropped by the pruner fires no DELETE trigger:
-- its jobs leave no 'pruned' row.
CREATE FUNCTION {schema}.job_audit_record_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.job_audit
        (job_id, queue, from_state, to_state, lease_token, attempts, run_at)
    SELECT gone.id, gone.queue, gone.state::text, coalesce(now_in.state::text, 'pruned'),
           gone.lease_token, coalesce(now_in.attempts, gone.attempts),
           coalesce(now_in.run_at, gone.run_at)
    FROM audit_deleted AS gone
    LEFT JOIN {schema}.jobs AS now_in ON now_in.id = gone.id;
    RETURN NULL;
END;
$$;

CREATE TRIGGER job_audit_active_delete
    AFTER DELETE ON {schema}.active_jobs
    REFERENCING OLD TABLE AS audit_deleted
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.job_audit_record_delete();

CREATE TRIGGER job_audit_finished_delete
    AFTER DELETE ON {schema}.finished_jobs
    REFERENCING OLD TABLE AS audit_deleted
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.job_audit_record_delete();

-- name: audit_transitions
-- The trail after row ``after`` (0: all of it), oldest first.
SELECT id, job_id, queue, from_state, to_state, lease_token, attempts, run_at, at
FROM {schema}.job_audit
WHERE id > %(after)s
ORDER BY id;
