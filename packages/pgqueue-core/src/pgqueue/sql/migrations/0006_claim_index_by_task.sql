-- Version 6: the claim index leads with the queue and the task, so that claims and the
-- next-run check read only the jobs of the tasks they ask for, never the backlog of
-- tasks a worker does not serve. See ../schema.sql for what each part is for.
--
-- Applied in one transaction, the index is rebuilt over the queued jobs while claims
-- and enqueues wait: a second or two per half a million queued jobs on two cores.

DROP INDEX {schema}.active_jobs_claim_idx;

CREATE INDEX active_jobs_claim_idx
    ON {schema}.active_jobs (queue, task, priority DESC, run_at, id)
    WHERE state = 'queued';
