"""The finished jobs' history: jobs move out of active_jobs when they finish and back when
retried, are counted without triggers, and retention drops whole days."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from lock_watch import LockedReads
from psycopg import sql

from pgqueue import JobState, Queue, WorkerProtocol, history, queries
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


# -- making days beside a DEFAULT partition that holds jobs -------------------------------


def _drop(db: psycopg.Connection, schema: str, day: history.Day) -> None:
    db.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(schema, day.name)))


def _finished_at(db: psycopg.Connection, schema: str, count: int, when: str) -> None:
    """``count`` succeeded jobs written straight into the history, finished at ``when``
    (an SQL expression); a job no day covers lands in the DEFAULT partition."""
    db.execute(
        sql.SQL(
            "INSERT INTO {}.finished_jobs (id, queue, task, payload, priority, state, run_at,"
            " attempts, max_attempts, enqueued_at, finished_at)"
            " SELECT nextval({}), 'old', 't', jsonb_build_object('n', n, 'pad', repeat('x', 200)),"
            " 0, 'succeeded', now(), 1, 5, now(), " + when + " FROM generate_series(1, %s) AS n"
        ).format(sql.Identifier(schema), sql.Literal(f"{schema}.job_ids")),
        (count,),
    )


def _fences(db: psycopg.Connection, schema: str) -> list[str]:
    rows = db.execute(
        "SELECT conname FROM pg_constraint AS c JOIN pg_class AS t ON t.oid = c.conrelid"
        " JOIN pg_namespace AS n ON n.oid = t.relnamespace"
        " WHERE n.nspname = %s AND t.relname LIKE %s",
        (schema, "%default"),
    ).fetchall()
    return [name for (name,) in rows if "fence" in name]


@pytest.fixture
def watched(database_url: str, schema: str):
    """A connection that notes each read of a DEFAULT partition under a lock that acks
    wait for (see lock_watch)."""
    with LockedReads.connect(database_url, autocommit=True) as conn:
        yield conn.watch(schema)


def test_a_day_whose_jobs_wait_in_a_small_default_partition_is_made_and_gets_them(
    queue: Queue, db, schema
):
    today = history.days(db, schema)[1]
    day = history.Day(JobState.SUCCEEDED, today)
    _drop(db, schema, day)
    protocol = WorkerProtocol(queue)
    # Jobs finished while no day covered today: into the DEFAULT partition.
    queue.enqueue("t")
    acked = protocol.ack(protocol.claim(["default"], ["t"])[0], None)
    _finished_at(db, schema, 20, "now()")
    default = history.default_partition(JobState.SUCCEEDED)
    assert _count(db, schema, default) == 21

    made = history.create_days(db, schema)

    assert _count(db, schema, day.name) == 21
    assert _count(db, schema, default) == 0
    assert queue.get(acked.id).state is JobState.SUCCEEDED
    assert made.created == [day.name] and made.left == {}
    # The day is a partition like any other: no constraint of its own.
    constraints = db.execute(
        "SELECT count(*) FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'c'",
        (f"{schema}.{day.name}",),
    ).fetchone()[0]
    assert constraints == 0


def _size(db: psycopg.Connection, schema: str, table: str) -> int:
    return db.execute("SELECT pg_relation_size(%s::regclass)", (f"{schema}.{table}",)).fetchone()[0]


def test_a_day_that_has_begun_is_not_made_beside_a_large_default_partition(
    queue: Queue, db, schema, watched
):
    existing, today, _ = history.days(db, schema)
    for day in existing:
        if day.state is JobState.SUCCEEDED:
            _drop(db, schema, day)
    # More than a moment's read under the lock that acks would wait for (1 MiB).
    _finished_at(db, schema, 10_000, "now()")
    default = history.default_partition(JobState.SUCCEEDED)
    assert _size(db, schema, default) > 1 << 20

    made = history.create_days(watched, schema)

    assert watched.found == []
    later = [history.Day(JobState.SUCCEEDED, today + timedelta(days=n)) for n in (1, 2)]
    assert set(later) <= set(history.days(db, schema)[0])
    assert _count(db, schema, default) == 10_000
    assert _fences(db, schema) == []
    today_name = history.Day(JobState.SUCCEEDED, today).name
    assert made.created == [day.name for day in later]
    assert list(made.left) == [today_name]
    assert "finish into" in made.left[today_name]
    # Jobs finishing today still finish, into the DEFAULT partition.
    protocol = WorkerProtocol(queue)
    queue.enqueue("t")
    acked = protocol.ack(protocol.claim(["default"], ["t"])[0], None)
    assert _count(db, schema, default) == 10_001
    assert queue.get(acked.id).state is JobState.SUCCEEDED


def test_a_coming_day_is_made_beside_a_large_default_partition_and_gets_its_jobs(
    queue: Queue, db, schema, watched
):
    today = history.days(db, schema)[1]
    later = history.Day(JobState.SUCCEEDED, today + timedelta(days=2))
    _drop(db, schema, later)
    _finished_at(db, schema, 8_000, "now() - interval '30 days'")
    # Jobs of that day, written by hand before it was made.
    start = (today + timedelta(days=2)).isoformat()
    _finished_at(db, schema, 2_500, f"'{start} 01:00+00'::timestamptz")
    default = history.default_partition(JobState.SUCCEEDED)
    assert _size(db, schema, default) > 1 << 20

    made = history.create_days(watched, schema)

    assert watched.found == []
    assert later in history.days(db, schema)[0]
    assert _count(db, schema, later.name) == 2_500
    assert _count(db, schema, default) == 8_000
    assert _fences(db, schema) == []
    assert made.created == [later.name] and made.left == {}


def test_a_fence_left_on_a_default_partition_is_taken_down_before_its_day(queue: Queue, db, schema):
    """A round that began making today beside a large DEFAULT partition (a day ago, when
    today was two days ahead) stopped midway: the fence would refuse today's acks."""
    today = history.days(db, schema)[1]
    day = history.Day(JobState.SUCCEEDED, today)
    _drop(db, schema, day)
    _finished_at(db, schema, 5, "now()")
    parts = day._parts()
    for name in ("history_fence_add", "history_day_table"):
        db.execute(queries.compose(name, schema, **parts))
    moved = db.execute(queries.compose("history_day_fill", schema, **parts), {"batch_size": 3})
    assert moved.fetchone()[0] == 3
    assert _fences(db, schema) == [day.fence]

    history.create_days(db, schema)

    assert _fences(db, schema) == []
    # The day is made (its DEFAULT partition is small), with every one of its jobs.
    assert day in history.days(db, schema)[0]
    assert _count(db, schema, day.name) == 5
    protocol = WorkerProtocol(queue)
    queue.enqueue("t")
    protocol.ack(protocol.claim(["default"], ["t"])[0], None)
    assert _count(db, schema, day.name) == 6
