"""The finished jobs' history: jobs move out of active_jobs when they finish and back when
retried, are counted without triggers, and retention drops whole days."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

from pgqueue import JobState, Queue, WorkerProtocol, history
from pgqueue.errors import JobNotFound


def _count(db: psycopg.Connection, schema: str, table: str) -> int:
    return db.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, table))
    ).fetchone()[0]


def _finished(queue: Queue, count: int, *, key_prefix: str) -> list[int]:
    protocol = WorkerProtocol(queue)
    ids = []
    for n in range(count):
        queue.enqueue("t", {"n": n}, queue="old", idempotency_key=f"{key_prefix}-{n}")
        (job,) = protocol.claim(["old"], ["t"])
        protocol.ack(job, {"n": n})
        ids.append(job.id)
    return ids


def test_finishing_moves_a_job_out_of_the_active_table_and_retry_brings_it_back(
    queue: Queue, db, schema
):
    protocol = WorkerProtocol(queue)
    job = queue.enqueue("t", max_attempts=1).job
    assert _count(db, schema, "active_jobs") == 1
    (claimed,) = protocol.claim(["default"], ["t"])
    dead = protocol.fail(claimed, "boom")

    assert dead.state is JobState.DEAD
    assert _count(db, schema, "active_jobs") == 0
    assert _count(db, schema, "finished_jobs_dead") == 1
    assert queue.get(job.id) == dead

    retried = queue.retry(job.id)
    assert retried.state is JobState.QUEUED and retried.id == job.id
    assert retried.errors == dead.errors and retried.last_error == "boom"
    assert _count(db, schema, "finished_jobs") == 0
    counts = {s.queue: s.counts for s in queue.stats()}["default"]
    assert counts == {
        "waiting": 0,
        "queued": 1,
        "running": 0,
        "succeeded": 0,
        "dead": 0,
        "cancelled": 0,
    }


def test_counts_follow_every_move_without_triggers(queue: Queue, db, schema):
    protocol = WorkerProtocol(queue)
    # The schema's one trigger checks a transaction's new dependents as it commits (on a
    # table of their own); none is on the jobs' tables or the counters.
    triggers = db.execute(
        "SELECT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND NOT t.tgisinternal",
        (schema,),
    ).fetchall()
    assert triggers == [("dependents_to_check",)]
    ids = [queue.enqueue("t", max_attempts=2).job.id for _ in range(6)]
    first, second, third, fourth = protocol.claim(["default"], ["t"], limit=4)
    protocol.ack(first, None)
    protocol.fail(second, "again")  # back to queued
    queue.cancel(third.id)
    queue.cancel(ids[5])  # cancelled while queued
    queue.retry(ids[5])
    protocol.ack(fourth, None)

    stats = {s.queue: s.counts for s in queue.stats()}["default"]
    assert stats == {
        "waiting": 0,
        "queued": 3,
        "running": 0,
        "succeeded": 2,
        "dead": 0,
        "cancelled": 1,
    }
    (metrics,) = queue.metrics_snapshot().queues
    assert (metrics.completed, metrics.failures) == (2, 1)


def test_a_day_past_its_retention_is_dropped_whole_with_its_keys_and_counts(
    queue: Queue, db, schema
):
    old = _finished(queue, 3, key_prefix="old")
    recent = _finished(queue, 1, key_prefix="recent")
    today = db.execute("SELECT (now() AT TIME ZONE 'UTC')::date").fetchone()[0]
    day = history.Day(JobState.SUCCEEDED, today - timedelta(days=10))
    day.create(db, schema)
    # As if the three had finished that day: they move into its partition.
    db.execute(
        sql.SQL("UPDATE {} SET finished_at = %s WHERE id = ANY(%s)").format(
            sql.Identifier(schema, "finished_jobs")
        ),
        (day.end - timedelta(hours=12), old),
    )
    assert _count(db, schema, day.name) == 3

    removed = queue.prune_expired({JobState.SUCCEEDED: timedelta(days=7)})

    assert removed == 3
    assert db.execute("SELECT to_regclass(%s)", (f"{schema}.{day.name}",)).fetchone()[0] is None
    for job_id in old:
        with pytest.raises(JobNotFound):
            queue.get(job_id)
    assert queue.get(recent[0]).state is JobState.SUCCEEDED
    assert {s.queue: s.counts["succeeded"] for s in queue.stats()}["old"] == 1
    # The dropped jobs' idempotency keys are free again; the kept job's is not.
    assert queue.enqueue("t", {"n": 0}, queue="old", idempotency_key="old-0").created
    assert not queue.enqueue("t", {"n": 0}, queue="old", idempotency_key="recent-0").created


def test_the_coming_days_exist_after_migrating_and_a_pruner_round(queue: Queue, db, schema):
    protocol = WorkerProtocol(queue)
    found, today, _ = history.days(db, schema)
    expected = {
        (state, today + timedelta(days=n))
        for state in (JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED)
        for n in range(history.DAYS_AHEAD)
    }
    assert {(d.state, d.day) for d in found} == expected
    queue.prune_expired({JobState.SUCCEEDED: timedelta(days=7)})
    assert {(d.state, d.day) for d in history.days(db, schema)[0]} == expected
    # Jobs finishing now land in today's partition, not the DEFAULT one.
    job = queue.enqueue("t").job
    protocol.ack(protocol.claim(["default"], ["t"])[0], None)
    assert _count(db, schema, history.Day(JobState.SUCCEEDED, today).name) == 1
    assert _count(db, schema, history.default_partition(JobState.SUCCEEDED)) == 0
    assert queue.get(job.id).state is JobState.SUCCEEDED
