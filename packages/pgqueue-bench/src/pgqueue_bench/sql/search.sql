-- Statements of the search driver (pgqueue_bench/scenarios/search.py): its set-up, written
-- straight into the tables, since the jobs are what is searched, not how they came.

-- name: search_indexes_drop
-- Loading a million rows into GIN indexes costs more than building them after: the
-- build is measured on its own (search_indexes_create).
DROP INDEX {schema}.active_jobs_tags_idx, {schema}.active_jobs_payload_idx;

-- name: search_active_load
-- %(count)s queued jobs: customer n mod 100000 (10 jobs each per million), kind one of
-- three, and tags "c<n mod 1000>" (1,000 jobs each per million) and a region.
INSERT INTO {schema}.active_jobs (queue, task, payload, tags)
SELECT 'default', 'noop',
       jsonb_build_object('customer', n %% 100000, 'order', n,
                          'kind', (ARRAY['invoice', 'refund', 'reminder'])[1 + n %% 3]),
       ARRAY['c' || (n %% 1000), (ARRAY['eu', 'us', 'apac'])[1 + n %% 3]]
FROM generate_series(1, %(count)s) AS n;

-- name: search_tags_index_create
CREATE INDEX active_jobs_tags_idx ON {schema}.active_jobs USING gin (tags)
    WHERE tags IS NOT NULL;

-- name: search_payload_index_create
CREATE INDEX active_jobs_payload_idx ON {schema}.active_jobs
    USING gin (payload jsonb_path_ops);

-- name: search_finished_load
-- %(count)s succeeded jobs, finished today, payloads and tags drawn as above but with
-- customers from 100000 up, so that a search finds each set apart.
INSERT INTO {schema}.finished_jobs
    (id, queue, task, payload, priority, state, run_at, attempts, max_attempts,
     enqueued_at, started_at, finished_at, tags)
SELECT nextval('{schema}.job_ids'), 'default', 'noop',
       jsonb_build_object('customer', 100000 + n %% 100000, 'order', n,
                          'kind', (ARRAY['invoice', 'refund', 'reminder'])[1 + n %% 3]),
       0, 'succeeded', now(), 1, 5, now(), now(), now(),
       ARRAY['h' || (n %% 1000), (ARRAY['eu', 'us', 'apac'])[1 + n %% 3]]
FROM generate_series(1, %(count)s) AS n;

-- name: search_vacuum
VACUUM (ANALYZE) {schema}.active_jobs, {schema}.finished_jobs;
