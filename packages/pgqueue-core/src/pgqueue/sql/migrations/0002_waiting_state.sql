-- Version 2: the waiting state, of jobs that wait for other jobs (see version 3). On
-- its own: a new enum value cannot be used in the transaction that adds it.

ALTER TYPE {schema}.job_state ADD VALUE 'waiting' BEFORE 'queued';
