-- Version 3: jobs that wait for other jobs (depends_on). See ../schema.sql for what
-- each part is for.

ALTER TABLE {schema}.active_jobs
    DROP CONSTRAINT active_jobs_state_check,
    ADD CONSTRAINT active_jobs_state_check CHECK (state IN ('waiting', 'queued', 'running')),
    ADD COLUMN pending_dependencies integer,
    ADD COLUMN has_dependents boolean NOT NULL DEFAULT false;

ALTER TABLE {schema}.finished_jobs
    ADD COLUMN pending_dependencies integer,
    ADD COLUMN has_dependents boolean NOT NULL DEFAULT false;

CREATE OR REPLACE VIEW {schema}.jobs AS
    SELECT * FROM {schema}.active_jobs
    UNION ALL
    SELECT * FROM {schema}.finished_jobs;

CREATE TABLE {schema}.job_dependencies (
    depends_on bigint NOT NULL,
    job_id     bigint NOT NULL,
    PRIMARY KEY (depends_on, job_id)
);

CREATE INDEX job_dependencies_job_id_idx ON {schema}.job_dependencies (job_id);
