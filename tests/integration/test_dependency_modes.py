"""Results along dependencies (``job.dependencies``, loaded with the claim) and
``dependency_mode="finished"``: a dependent that waits for its dependencies to be final
in any state, released by a death or a cancel as by an ack, never cancelled by them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import (
    BatchItem,
    Job,
    JobSpec,
    JobState,
    Queue,
    ValidationError,
    WorkerProtocol,
)
from pgqueue.dependencies import Dependency


def _claim_all(queue: Queue, task: str = "t") -> dict[int, Job]:
    return {job.id: job for job in WorkerProtocol(queue).claim(["default"], [task], limit=1000)}


def _pending(db: psycopg.Connection, schema: str, job_id: int) -> Any:
    query = sql.SQL("SELECT pending_dependencies FROM {}.jobs WHERE id = %s")
    return db.execute(query.format(sql.Identifier(schema)), (job_id,)).fetchone()[0]


def _kill(queue: Queue, job_id: int, task: str = "t") -> None:
    """Run ``job_id`` (enqueued with max_attempts=1) to its death."""
    WorkerProtocol(queue).fail(_claim_all(queue, task)[job_id], "boom")


def test_a_claimed_job_carries_its_dependencies_in_the_order_named(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    a, b, c = (queue.enqueue("t", {"n": n}).job for n in (1, 2, 3))
    after = queue.enqueue("after", depends_on=[c.id, a.id, b.id]).job
    for job in _claim_all(queue).values():
        protocol.ack(job, {"n": job.payload["n"]})
    (claimed,) = _claim_all(queue, "after").values()
    assert claimed.id == after.id
    assert claimed.dependencies == (
        Dependency(c.id, "t", "succeeded", {"n": 3}),
        Dependency(a.id, "t", "succeeded", {"n": 1}),
        Dependency(b.id, "t", "succeeded", {"n": 2}),
    )
    # A job without dependencies has none, and costs its claim nothing more.
    plain = queue.enqueue("t").job
    assert _claim_all(queue)[plain.id].dependencies == ()


def test_a_batch_item_named_twice_by_position_and_id_is_one_dependency(queue: Queue) -> None:
    first = queue.enqueue_many([JobSpec("t"), JobSpec("t")])
    ids = [r.job.id for r in first]
    WorkerProtocol(queue).ack_many([(job, job.id) for job in _claim_all(queue).values()])
    after = queue.enqueue("after", depends_on=[ids[1], ids[0], ids[1]]).job
    assert after.state is JobState.QUEUED
    (claimed,) = _claim_all(queue, "after").values()
    assert [(d.id, d.result) for d in claimed.dependencies] == [(ids[1], ids[1]), (ids[0], ids[0])]


def test_a_pruned_dependency_is_reported_as_such(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    kept, gone = queue.enqueue("t").job, queue.enqueue("t").job
    waits = queue.enqueue("after", depends_on=[gone.id, kept.id]).job
    group = queue.enqueue("after", depends_on=[gone.id, kept.id], dependency_mode="finished").job
    claimed = _claim_all(queue)
    protocol.ack(claimed[gone.id], "lost")
    protocol.ack(claimed[kept.id], "kept")
    # Only the succeeded job is pruned, as a retention of succeeded history would.
    assert queue.prune(0, states=["succeeded"], batch_size=1) == 2
    released = _claim_all(queue, "after")
    assert released[waits.id].dependencies == (
        Dependency(gone.id, None, "succeeded", None, pruned=True),
        Dependency(kept.id, None, "succeeded", None, pruned=True),
    )
    # In "finished" mode it could have ended in any state: only its id is known.
    assert released[group.id].dependencies[0] == Dependency(
        gone.id, None, "pruned", None, pruned=True
    )


def test_finished_mode_is_released_by_a_death_and_a_cancel_and_sees_them(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    ok = queue.enqueue("t").job
    dies = queue.enqueue("t", max_attempts=1).job
    cancelled = queue.enqueue("slow").job
    callback = queue.enqueue(
        "report", depends_on=[ok.id, dies.id, cancelled.id], dependency_mode="finished"
    ).job
    strict = queue.enqueue("report", depends_on=[ok.id, dies.id, cancelled.id]).job
    assert (callback.state, strict.state) == (JobState.WAITING, JobState.WAITING)

    claimed = _claim_all(queue)
    protocol.ack(claimed[ok.id], 1)
    protocol.fail(claimed[dies.id], "boom")
    assert queue.get(strict.id).state is JobState.CANCELLED
    assert queue.get(callback.id).state is JobState.WAITING
    queue.cancel(cancelled.id)
    assert queue.get(callback.id).state is JobState.QUEUED
    assert queue.dependencies(callback.id).dependency_mode == "finished"
    assert queue.dependencies(strict.id).dependency_mode == "succeeded"

    (released,) = _claim_all(queue, "report").values()
    assert [(d.id, d.state, d.result) for d in released.dependencies] == [
        (ok.id, "succeeded", 1),
        (dies.id, "dead", None),
        (cancelled.id, "cancelled", None),
    ]


def test_finished_mode_over_jobs_already_final_is_queued_at_once(queue: Queue) -> None:
    dead = queue.enqueue("t", max_attempts=1).job
    _kill(queue, dead.id)
    cancelled = queue.enqueue("other").job
    queue.cancel(cancelled.id)
    one = queue.enqueue("report", depends_on=[dead.id, cancelled.id], dependency_mode="finished")
    assert one.job.state is JobState.QUEUED
    # In a batch, and in the cascade of an item cancelled by a dead dependency.
    batch = queue.enqueue_many(
        [
            JobSpec("t", depends_on=[dead.id]),
            JobSpec("report", depends_on=[BatchItem(0)], dependency_mode="finished"),
            JobSpec("report", depends_on=[BatchItem(0)]),
        ]
    )
    assert [r.job.state for r in batch] == [
        JobState.CANCELLED,
        JobState.QUEUED,
        JobState.CANCELLED,
    ]
    # Beside a default-mode item cancelled by a dead job they both name, a callback
    # still waits for the item of its batch that has not ended.
    mixed = queue.enqueue_many(
        [
            JobSpec("t"),
            JobSpec("report", depends_on=[BatchItem(0), dead.id], dependency_mode="finished"),
            JobSpec("report", depends_on=[BatchItem(0), dead.id]),
        ]
    )
    assert [r.job.state for r in mixed] == [
        JobState.QUEUED,
        JobState.WAITING,
        JobState.CANCELLED,
    ]


def test_finished_mode_in_a_callers_transaction_is_never_cancelled_at_commit(
    queue: Queue, database_url: str, db, schema
) -> None:
    for _ in range(20):
        doomed = queue.enqueue("t", max_attempts=1).job
        other = queue.enqueue("other").job
        (claimed,) = _claim_all(queue).values()
        with psycopg.connect(database_url) as conn:
            callback = queue.enqueue(
                "report", depends_on=[doomed.id, other.id], dependency_mode="finished", conn=conn
            ).job
            assert callback.state is JobState.WAITING
            _commit_racing(conn, partial(WorkerProtocol(queue).fail, claimed, "boom"))
        # However the death and the commit met, one dependency is left: "other".
        assert queue.get(callback.id).state is JobState.WAITING
        assert _pending(db, schema, callback.id) == 1
        queue.cancel(other.id)
        assert queue.get(callback.id).state is JobState.QUEUED
        queue.cancel(callback.id)


def test_a_death_and_an_ack_of_the_last_two_release_the_callback_once(
    queue: Queue, db, schema
) -> None:
    protocol = WorkerProtocol(queue)
    for _ in range(20):
        ok, dies = queue.enqueue("t").job, queue.enqueue("t", max_attempts=1).job
        callback = queue.enqueue(
            "report", depends_on=[ok.id, dies.id], dependency_mode="finished"
        ).job
        claimed = _claim_all(queue)
        _in_parallel(
            partial(protocol.ack, claimed[ok.id]), partial(protocol.fail, claimed[dies.id], "x")
        )
        assert queue.get(callback.id).state is JobState.QUEUED
        assert _pending(db, schema, callback.id) == 0
        queue.cancel(callback.id)


def test_a_finished_mode_job_is_retried_without_refusal(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    dies = queue.enqueue("t", max_attempts=1).job
    callback = queue.enqueue(
        "report", depends_on=[dies.id], dependency_mode="finished", max_attempts=1
    ).job
    _kill(queue, dies.id)
    protocol.fail(_claim_all(queue, "report")[callback.id], "the report failed")
    assert queue.get(callback.id).state is JobState.DEAD
    # Its dependency is dead, which a "succeeded" dependent's retry would be refused for.
    retried = queue.retry(callback.id)
    assert retried.state is JobState.QUEUED
    # Retried again while its dependency runs again: it waits for it to be final.
    protocol.fail(_claim_all(queue, "report")[callback.id], "the report failed again")
    queue.retry(dies.id)
    assert queue.retry(callback.id).state is JobState.WAITING
    _kill(queue, dies.id)
    (released,) = _claim_all(queue, "report").values()
    assert [(d.id, d.state) for d in released.dependencies] == [(dies.id, "dead")]


def test_a_dependency_retried_while_the_callback_waits_is_waited_for_again(
    queue: Queue, db, schema
) -> None:
    protocol = WorkerProtocol(queue)
    dies, other = queue.enqueue("t", max_attempts=1).job, queue.enqueue("other").job
    callback = queue.enqueue(
        "report", depends_on=[dies.id, other.id], dependency_mode="finished"
    ).job
    _kill(queue, dies.id)
    assert _pending(db, schema, callback.id) == 1
    queue.retry(dies.id)
    assert _pending(db, schema, callback.id) == 2
    # Its second end is counted once: the callback still waits for "other".
    protocol.ack(_claim_all(queue)[dies.id], "second time")
    assert queue.get(callback.id).state is JobState.WAITING
    assert _pending(db, schema, callback.id) == 1
    protocol.ack(_claim_all(queue, "other")[other.id])
    (released,) = _claim_all(queue, "report").values()
    assert [(d.state, d.result) for d in released.dependencies] == [
        ("succeeded", "second time"),
        ("succeeded", None),
    ]


@pytest.mark.parametrize("mode", ["", "any", "Finished", None])
def test_an_unknown_dependency_mode_is_a_validation_error(mode: Any) -> None:
    with pytest.raises(ValidationError, match="dependency_mode"):
        JobSpec("t", depends_on=[1], dependency_mode=mode)


def _in_parallel(*calls: Callable[[], Any]) -> list[Any]:
    """Run ``calls`` in threads released together; their results, in order."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(index: int, call: Callable[[], Any]) -> None:
        barrier.wait()
        try:
            results[index] = call()
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    if errors:
        raise errors[0]
    return results


def _commit_racing(conn: psycopg.Connection, *calls: Callable[[], Any]) -> list[Any]:
    """Commit ``conn`` and run ``calls``, all released together; their results."""
    return _in_parallel(conn.commit, *calls)[1:]
