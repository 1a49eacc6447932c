-- Statements of the enqueue driver (pgqueue bench enqueue). pgqueue's own enqueues go
-- through pgqueue.Queue and the real API; these statements are the raw SQL it is
-- measured against, on a plain table beside the jobs table, and the row counts that
-- verify every case.
--
-- Placeholders: {schema} is the quoted schema of the run, {table} a quoted table name.
-- Parameters use psycopg's %(name)s style.

-- name: plain_table_create
-- The columns, defaults, constraints and indexes of active_jobs (where enqueues go),
-- the partial claim index included, without its trigger: what the same rows cost with
-- nothing but PostgreSQL in the way.
CREATE TABLE {schema}.plain_jobs (LIKE {schema}.active_jobs INCLUDING ALL);

-- name: plain_insert_one
INSERT INTO {schema}.plain_jobs (queue, task, payload)
VALUES (%(queue)s, %(task)s, %(payload)s)
RETURNING id;

-- name: plain_insert_many
-- One statement for the whole batch, one array per column.
INSERT INTO {schema}.plain_jobs (queue, task, payload)
SELECT queue, task, payload
FROM unnest(%(queue)s::text[], %(task)s::text[], %(payload)s::jsonb[]) AS item (queue, task, payload)
RETURNING id;

-- name: plain_copy
COPY {schema}.plain_jobs (queue, task, payload) FROM STDIN;

-- name: rows_count
SELECT count(*) AS rows FROM {table};
