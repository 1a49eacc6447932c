-- Statements of `pgqueue bench effects`: the application table its handlers write, and
-- what the driver reads of it. pgqueue's tables are not touched here.
--
-- Placeholders: {schema} is the quoted schema of the run. Parameters use psycopg's
-- %(name)s style.

-- name: effects_table_create
-- The application's table: one row per handler run that committed its write. No
-- unique constraint on job_id, on purpose: a second row for a job is a duplicate side
-- effect, and it must stay there to be counted.
CREATE TABLE {schema}.effects_rows (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      bigint NOT NULL,
    task        text NOT NULL,
    attempt     integer NOT NULL,
    lease_token uuid,
    pid         integer NOT NULL,
    written_at  timestamptz NOT NULL DEFAULT now()
);

-- name: effects_row_insert
INSERT INTO {schema}.effects_rows (job_id, task, attempt, lease_token, pid)
VALUES (%(job_id)s, %(task)s, %(attempt)s, %(lease_token)s, %(pid)s);

-- name: effects_rows_per_job
-- How many rows each job has, of each task (a job with none is not here).
SELECT job_id, task, count(*) AS rows
FROM {schema}.effects_rows
GROUP BY job_id, task;
