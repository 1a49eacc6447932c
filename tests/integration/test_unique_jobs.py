"""Unique jobs: while a queued or running job holds a unique key, enqueueing another
returns that job; once it has finished (succeeded, dead, cancelled) the key is free.
The database enforces it, also between concurrent producers and with an idempotency
key on the same job."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import (
    InvalidTransition,
    JobSpec,
    JobState,
    Queue,
    UniqueKeyHeld,
    ValidationError,
    WorkerProtocol,
    bulk,
)


def _count(db: psycopg.Connection, schema: str, unique_key: str | None = None) -> int:
    query = sql.SQL("SELECT count(*) FROM {}.jobs WHERE unique_key IS NOT DISTINCT FROM %s")
    return db.execute(query.format(sql.Identifier(schema)), (unique_key,)).fetchone()[0]


def _claim(queue: Queue, task: str = "sync", **kwargs: Any):
    protocol = WorkerProtocol(queue)
    (job,) = protocol.claim(["default"], [task], limit=1, **kwargs)
    return job


def test_a_held_key_returns_its_job_uncompared_until_the_job_finishes(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    first = queue.enqueue("sync", {"account": 1}, unique_key="sync:1")
    assert first.created and first.job.unique_key == "sync:1"
    # Not compared: another task, payload, queue or priority still gets the holder.
    again = queue.enqueue("other", {"x": 2}, queue="elsewhere", priority=9, unique_key="sync:1")
    assert not again.created and again.job == queue.get(first.job.id)
    assert queue.enqueue("sync", {"account": 2}, unique_key="sync:2").created
    # Running still holds it.
    running = _claim(queue)
    assert running.id == first.job.id and running.unique_key == "sync:1"
    held = queue.enqueue("sync", unique_key="sync:1")
    assert not held.created and held.job.id == first.job.id
    assert held.job.state is JobState.RUNNING
    # Succeeded: free again, and the finished job keeps its key as history.
    done = protocol.ack(running)
    assert done.unique_key == "sync:1" and queue.get(first.job.id).unique_key == "sync:1"
    fresh = queue.enqueue("sync", unique_key="sync:1")
    assert fresh.created and fresh.job.id > first.job.id


def test_a_dead_job_frees_its_key(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    job = queue.enqueue("sync", unique_key="k", max_attempts=1).job
    dead = protocol.fail(_claim(queue), "boom")
    assert dead.state is JobState.DEAD and dead.unique_key == "k"
    fresh = queue.enqueue("sync", unique_key="k")
    assert fresh.created and fresh.job.id != job.id


def test_a_reaped_dead_job_frees_its_key(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    queue.enqueue("sync", unique_key="k", max_attempts=1)
    _claim(queue, lease_seconds=0.1)
    time.sleep(0.3)
    (dead,) = protocol.reap()
    assert dead.state is JobState.DEAD and dead.unique_key == "k"
    assert queue.enqueue("sync", unique_key="k").created


def test_a_failed_attempt_that_will_be_retried_keeps_the_key(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    job = queue.enqueue("sync", unique_key="k", max_attempts=3).job
    failed = protocol.fail(_claim(queue), "try again")
    assert failed.state is JobState.QUEUED and failed.unique_key == "k"
    again = queue.enqueue("sync", unique_key="k")
    assert not again.created and again.job.id == job.id


def test_a_cancelled_job_frees_its_key_and_its_retry_is_refused_while_it_is_held(
    queue: Queue, db, schema
) -> None:
    job = queue.enqueue("sync", unique_key="k").job
    assert queue.cancel(job.id).unique_key == "k"
    other = queue.enqueue("sync", unique_key="k")
    assert other.created
    # The key now belongs to the new job: the retry is refused, naming it, and nothing
    # changes.
    with pytest.raises(UniqueKeyHeld) as caught:
        queue.retry(job.id)
    assert isinstance(caught.value, InvalidTransition)
    assert (caught.value.job_id, caught.value.holder_id) == (job.id, other.job.id)
    assert caught.value.state == "cancelled"
    assert f"job {other.job.id}" in str(caught.value) and "'k'" in str(caught.value)
    assert queue.get(job.id).state is JobState.CANCELLED
    # Once the holder has finished, the retry takes the key back.
    queue.cancel(other.job.id)
    retried = queue.retry(job.id)
    assert retried.state is JobState.QUEUED and retried.unique_key == "k"
    assert queue.enqueue("sync", unique_key="k").job.id == job.id
    assert _count(db, schema, "k") == 2


def test_a_batch_repeating_a_key_creates_one_job_and_returns_it_for_each_repeat(
    queue: Queue, db, schema
) -> None:
    results = queue.enqueue_many(
        [
            JobSpec("sync", {"n": 0}, unique_key="a"),
            JobSpec("plain"),
            JobSpec("sync", {"n": 2}, unique_key="a"),
            JobSpec("sync", {"n": 3}, unique_key="b"),
            JobSpec("other", {"n": 4}, unique_key="a"),
        ]
    )
    assert [r.created for r in results] == [True, True, False, True, False]
    assert results[2].job == results[0].job == results[4].job
    assert results[0].job.payload == {"n": 0}
    # Ids follow the order of the jobs created.
    created = [r.job.id for r in results if r.created]
    assert created == sorted(created)
    assert _count(db, schema, "a") == 1 and _count(db, schema, "b") == 1


def test_a_large_batch_with_a_unique_key_does_not_take_the_copy_path(
    queue: Queue, db, schema
) -> None:
    specs = [JobSpec("plain", {"i": i}) for i in range(bulk.COPY_MIN_JOBS)]
    specs += [JobSpec("sync", unique_key="u"), JobSpec("sync", unique_key="u")]
    results = queue.enqueue_many(specs)
    assert [r.created for r in results[-2:]] == [True, False]
    assert results[-1].job.id == results[-2].job.id
    assert _count(db, schema, "u") == 1
    assert _count(db, schema) == bulk.COPY_MIN_JOBS


def test_twenty_concurrent_producers_of_one_key_create_exactly_one_job(
    database_url: str, db, schema
) -> None:
    producers = 20
    barrier = threading.Barrier(producers)
    outcomes: list[Any] = [None] * producers
    # One open connection per producer, so that all twenty statements run at once.
    queue = Queue.connect(database_url, schema=schema, min_size=producers, max_size=producers)
    queue.pool.wait()

    def produce(index: int) -> None:
        barrier.wait()
        try:
            outcomes[index] = queue.enqueue("sync", {"producer": index}, unique_key="race")
        except Exception as exc:  # reported below
            outcomes[index] = exc

    try:
        threads = [threading.Thread(target=produce, args=(i,)) for i in range(producers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        queue.close()
    errors = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    assert not errors, errors
    assert sum(outcome.created for outcome in outcomes) == 1
    assert len({outcome.job.id for outcome in outcomes}) == 1
    assert _count(db, schema, "race") == 1


def test_an_idempotency_key_is_checked_before_the_unique_key(queue: Queue, db, schema) -> None:
    protocol = WorkerProtocol(queue)
    first = queue.enqueue("sync", {"n": 1}, idempotency_key="req-1", unique_key="u").job
    # The same request again: its job, through the idempotency key.
    again = queue.enqueue("sync", {"n": 1}, idempotency_key="req-1", unique_key="u")
    assert not again.created and again.job.id == first.id
    # Another request while the unique key is held: the holder, whatever the payload,
    # and its idempotency key is not recorded (it names only a job it created).
    other = queue.enqueue("sync", {"n": 2}, idempotency_key="req-2", unique_key="u")
    assert not other.created and other.job.id == first.id
    assert queue.get_by_idempotency_key("req-2") is None
    # Once the holder has finished, the first request's repeat still returns it (held
    # until pruned), while the second request now creates its job.
    protocol.ack(_claim(queue))
    repeat = queue.enqueue("sync", {"n": 1}, idempotency_key="req-1", unique_key="u")
    assert not repeat.created and repeat.job.id == first.id
    assert repeat.job.state is JobState.SUCCEEDED
    second = queue.enqueue("sync", {"n": 2}, idempotency_key="req-2", unique_key="u")
    assert second.created and second.job.idempotency_key == "req-2"
    assert queue.get_by_idempotency_key("req-2") == second.job
    assert _count(db, schema, "u") == 2


def test_a_batch_whose_idempotency_key_was_turned_away_by_a_unique_key(queue: Queue) -> None:
    holder = queue.enqueue("sync", unique_key="u").job
    results = queue.enqueue_many(
        [
            JobSpec("sync", idempotency_key="r", unique_key="u"),  # turned away: holder
            JobSpec("mail", idempotency_key="r"),  # the key is still free: created
            JobSpec("mail", idempotency_key="r"),  # a repeat of the one above
        ]
    )
    assert [r.created for r in results] == [False, True, False]
    assert results[0].job.id == holder.id
    assert results[1].job == results[2].job and results[1].job.idempotency_key == "r"


@pytest.mark.parametrize("autocommit", [False, True])
def test_in_the_callers_transaction(queue: Queue, database_url: str, autocommit: bool) -> None:
    holder = queue.enqueue("sync", unique_key="u").job
    with psycopg.connect(database_url, autocommit=autocommit) as conn:
        turned = queue.enqueue("sync", idempotency_key="r", unique_key="u", conn=conn)
        created = queue.enqueue("sync", unique_key="v", conn=conn)
        conn.rollback()
    assert turned.job.id == holder.id and not turned.created and created.created
    assert queue.get_by_idempotency_key("r") is None
    # Rolled back (when the caller's transaction was open): the key is free.
    assert queue.enqueue("sync", unique_key="v").created is (not autocommit)


@pytest.mark.parametrize("bad", ["", "x" * 256, "a\x00b", 5])
def test_a_bad_unique_key_is_refused_naming_the_field(queue: Queue, bad: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        queue.enqueue("sync", unique_key=bad)
    assert caught.value.field == "unique_key"


def test_the_cli_enqueues_with_a_unique_key(database_url: str, schema: str) -> None:
    pgqueue = str(Path(sys.executable).parent / "pgqueue")
    command = [pgqueue, "enqueue", "sync", "--database-url", database_url, "--schema", schema]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*command, *args], capture_output=True, text=True, timeout=60)

    first = json.loads(run("--unique-key", "u").stdout)
    again = json.loads(run("--unique-key", "u", "--payload", '{"n": 2}').stdout)
    assert first["created"] and not again["created"]
    assert again["job"]["id"] == first["job"]["id"] and again["job"]["unique_key"] == "u"
    bad = run("--unique-key", "")
    assert bad.returncode != 0 and "unique_key: must not be empty" in bad.stderr
    assert "Traceback" not in bad.stderr
