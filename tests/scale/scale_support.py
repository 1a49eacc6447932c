"""Helpers for the scale tests: finished history written straight into a schema, and
the jobs of each state."""

from __future__ import annotations

import uuid

import psycopg
from psycopg import sql

from pgqueue import Job, JobState, Queue, WorkerProtocol

# Finished jobs as a busy month leaves them, written in one INSERT ... SELECT (the
# history is setup here, not what is under test). Job n finished ``age`` ago. The queue
# counters are not written: figures that count finished jobs do not include these.
HISTORY_INSERT = """
INSERT INTO {schema}.finished_jobs (id, queue, task, payload, priority, state, run_at,
                                    attempts, max_attempts, enqueued_at, started_at,
                                    finished_at, result)
SELECT nextval('{schema}.job_ids'), %(queue)s, 't', jsonb_build_object('n', n), 0,
       %(state)s::{schema}.job_state,
       now() - %(age)s::interval, 1, 5, now() - %(age)s::interval, now() - %(age)s::interval,
       now() - %(age)s::interval, '{{"ok": true}}'
FROM generate_series(1, %(count)s) AS n
"""


def add_history(
    db: psycopg.Connection,
    schema: str,
    count: int,
    *,
    state: str = "succeeded",
    age: str = "10 days",
    queue: str = "default",
) -> None:
    """Insert ``count`` jobs that finished in ``state`` ``age`` ago."""
    db.execute(
        sql.SQL(HISTORY_INSERT).format(schema=sql.Identifier(schema)),
        {"queue": queue, "state": state, "age": age, "count": count},
    )


def backdate(db: psycopg.Connection, schema: str, job_ids: list[int], age: str) -> None:
    """Make ``job_ids`` look as if they finished ``age`` ago."""
    db.execute(
        sql.SQL(
            "UPDATE {}.finished_jobs SET finished_at = now() - %s::interval WHERE id = ANY(%s)"
        ).format(sql.Identifier(schema)),
        (age, job_ids),
    )


def job_in_state(queue: Queue, state: JobState) -> Job:
    """A new job of task ``t`` in a queue of its own, moved to ``state``."""
    protocol = WorkerProtocol(queue)
    name = f"q_{uuid.uuid4().hex[:8]}"
    job = queue.enqueue("t", queue=name, max_attempts=1).job
    if state is JobState.QUEUED:
        return job
    (claimed,) = protocol.claim([name], ["t"], limit=1)
    assert claimed.id == job.id
    if state is JobState.RUNNING:
        return claimed
    if state is JobState.SUCCEEDED:
        return protocol.ack(claimed)
    if state is JobState.DEAD:
        return protocol.fail(claimed, "boom")
    return queue.cancel(claimed.id)


def remaining_ids(queue: Queue) -> set[int]:
    """Ids of every job left in the schema."""
    return {job.id for job in queue.list(limit=1000).jobs}
