"""Jobs that wait for other jobs: waiting until every dependency succeeded, queued by
the transaction that acks the last one (exactly once, also under concurrent acks and
enqueues), cancelled transitively when a dependency ends dead or cancelled."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import (
    BatchItem,
    DependenciesFailed,
    IdempotencyConflict,
    InvalidTransition,
    Job,
    JobSpec,
    JobState,
    Lease,
    Queue,
    UnknownDependencies,
    ValidationError,
    WorkerProtocol,
)


def _claim_all(queue: Queue, task: str = "t", queue_name: str = "default") -> dict[int, Job]:
    protocol = WorkerProtocol(queue)
    return {job.id: job for job in protocol.claim([queue_name], [task], limit=1000)}


def _pending(db: psycopg.Connection, schema: str, job_id: int) -> Any:
    query = sql.SQL("SELECT pending_dependencies FROM {}.jobs WHERE id = %s")
    return db.execute(query.format(sql.Identifier(schema)), (job_id,)).fetchone()[0]


def _count_jobs(db: psycopg.Connection, schema: str) -> int:
    query = sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(schema))
    return db.execute(query).fetchone()[0]


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
        thread.join(30)
    assert not errors, errors
    return results


def test_a_job_waits_until_every_dependency_succeeded(queue: Queue, db, schema) -> None:
    protocol = WorkerProtocol(queue)
    first, second = queue.enqueue("t").job, queue.enqueue("t").job
    waiting = queue.enqueue("t", {"n": 3}, depends_on=[first.id, second.id, first.id])
    assert waiting.created and waiting.job.state is JobState.WAITING
    assert _pending(db, schema, waiting.job.id) == 2
    # A waiting job is never claimed.
    claimed = _claim_all(queue)
    assert set(claimed) == {first.id, second.id}
    protocol.ack(claimed[first.id])
    assert queue.get(waiting.job.id).state is JobState.WAITING
    protocol.ack(claimed[second.id])
    released = queue.get(waiting.job.id)
    assert released.state is JobState.QUEUED and _pending(db, schema, released.id) == 0
    assert set(_claim_all(queue)) == {waiting.job.id}
    assert queue.dependencies(waiting.job.id).depends_on == [first.id, second.id]
    assert queue.dependencies(first.id).dependents == [waiting.job.id]


def test_a_dependency_that_already_succeeded_counts_as_met(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    done = queue.enqueue("t").job
    protocol.ack(_claim_all(queue)[done.id])
    dependent = queue.enqueue("t", depends_on=[done.id]).job
    assert dependent.state is JobState.QUEUED
    assert queue.dependencies(dependent.id).depends_on == [done.id]


def test_fan_out_then_fan_in_of_a_hundred_jobs_into_one(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    root = queue.enqueue("root").job
    fanned = queue.enqueue_many(JobSpec("leaf", depends_on=[root.id]) for _ in range(100))
    batch = [JobSpec("leaf-2") for _ in range(100)] + [
        JobSpec("join", depends_on=[*(r.job.id for r in fanned), *map(BatchItem, range(100))])
    ]
    joined = queue.enqueue_many(batch)[-1].job
    assert joined.state is JobState.WAITING
    assert {r.job.state for r in fanned} == {JobState.WAITING}

    protocol.ack(_claim_all(queue, "root")[root.id])
    leaves = _claim_all(queue, "leaf")
    assert len(leaves) == 100
    for job in list(leaves.values())[:99]:
        protocol.ack(job)
    for job in _claim_all(queue, "leaf-2").values():
        protocol.ack(job)
    assert queue.get(joined.id).state is JobState.WAITING
    protocol.ack(list(leaves.values())[99])
    assert queue.get(joined.id).state is JobState.QUEUED
    assert len(queue.dependencies(joined.id).depends_on) == 200


def test_a_chain_of_fifty_runs_in_order(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    chain = [queue.enqueue("t", {"n": 0}).job]
    for n in range(1, 50):
        chain.append(queue.enqueue("t", {"n": n}, depends_on=[chain[-1].id]).job)
    order = []
    while True:
        claimed = list(_claim_all(queue).values())
        if not claimed:
            break
        # Only the head of the chain is ever runnable.
        assert len(claimed) == 1
        order.append(claimed[0].payload["n"])
        protocol.ack(claimed[0])
    assert order == list(range(50))


def test_a_dead_dependency_cancels_its_whole_subtree(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    root = queue.enqueue("t", max_attempts=1).job
    other = queue.enqueue("other").job
    child = queue.enqueue("t", depends_on=[root.id]).job
    grandchild = queue.enqueue("t", depends_on=[child.id, other.id]).job
    unrelated = queue.enqueue("t", depends_on=[other.id]).job
    protocol.fail(_claim_all(queue)[root.id], "boom")

    assert queue.get(root.id).state is JobState.DEAD
    child_now, grandchild_now = queue.get(child.id), queue.get(grandchild.id)
    assert child_now.state is JobState.CANCELLED
    assert child_now.last_error == f"dependency {root.id} ended dead"
    assert grandchild_now.state is JobState.CANCELLED
    assert grandchild_now.last_error == f"dependency {child.id} ended cancelled"
    assert queue.get(unrelated.id).state is JobState.WAITING
    counts = {s.queue: s.counts for s in queue.stats()}["default"]
    assert counts["cancelled"] == 2 and counts["dead"] == 1 and counts["waiting"] == 1

    # Retrying the dead dependency does not bring its dependents back.
    queue.retry(root.id)
    protocol.ack(_claim_all(queue)[root.id])
    assert queue.get(child.id).state is JobState.CANCELLED
    # A new dependent of a dead job is cancelled as it is enqueued.
    doomed = queue.enqueue("other", max_attempts=1).job
    protocol.fail(_claim_all(queue, "other")[doomed.id], "boom")
    born = queue.enqueue("t", depends_on=[doomed.id, other.id])
    assert born.created and born.job.state is JobState.CANCELLED
    assert born.job.last_error == f"dependency {doomed.id} ended dead"


def test_cancelling_a_dependency_cancels_its_dependents_and_a_waiting_job_can_be_cancelled(
    queue: Queue,
) -> None:
    dependency = queue.enqueue("t").job
    dependent = queue.enqueue("t", depends_on=[dependency.id]).job
    second = queue.enqueue("t", depends_on=[dependency.id]).job
    assert queue.cancel(second.id).state is JobState.CANCELLED
    queue.cancel(dependency.id)
    cancelled = queue.get(dependent.id)
    assert cancelled.state is JobState.CANCELLED
    assert cancelled.last_error == f"dependency {dependency.id} ended cancelled"


def test_a_reaped_dependency_that_dies_cancels_its_dependents(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    dependency = queue.enqueue("t", max_attempts=1).job
    dependent = queue.enqueue("t", depends_on=[dependency.id]).job
    protocol.claim(["default"], ["t"], limit=1, lease_seconds=0.2)
    time.sleep(0.4)
    (reaped,) = protocol.reap()
    assert reaped.state is JobState.DEAD
    assert queue.get(dependent.id).state is JobState.CANCELLED


def test_unknown_dependencies_are_refused_and_nothing_is_added(queue: Queue, db, schema) -> None:
    real = queue.enqueue("t").job
    before = _count_jobs(db, schema)
    with pytest.raises(UnknownDependencies) as refused:
        queue.enqueue_many([JobSpec("t"), JobSpec("t", depends_on=[real.id, 10**12, 10**12 + 1])])
    assert refused.value.job_ids == [10**12, 10**12 + 1] and refused.value.index == 1
    assert f"no jobs with id {10**12}, {10**12 + 1}" in str(refused.value)
    assert _count_jobs(db, schema) == before
    assert queue.dependencies(real.id).dependents == []


@pytest.mark.parametrize(
    ("depends_on", "message"),
    [
        ([0], "is not a job id"),
        ([True], "is not a job id"),
        (["1"], "is not a job id"),
        (7, "must be a list"),
        ([BatchItem(-1)], "index must be"),
    ],
)
def test_bad_dependencies_are_validation_errors(depends_on: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        JobSpec("t", depends_on=depends_on)


def test_a_batch_item_must_name_an_earlier_item(queue: Queue) -> None:
    with pytest.raises(ValidationError, match="not an earlier item"):
        queue.enqueue_many([JobSpec("t", depends_on=[BatchItem(1)]), JobSpec("t")])
    with pytest.raises(ValidationError, match="not an earlier item"):
        queue.enqueue_many([JobSpec("t", depends_on=[BatchItem(0)])])


def test_a_refused_batch_in_the_callers_transaction_leaves_nothing_behind(
    queue: Queue, database_url: str, db, schema
) -> None:
    dependency = queue.enqueue("t").job
    queue.enqueue("t", {"a": 1}, idempotency_key="k")
    before = _count_jobs(db, schema)
    with psycopg.connect(database_url) as conn:
        conn.execute("CREATE TEMP TABLE mine (x int)")
        with pytest.raises(IdempotencyConflict):
            queue.enqueue_many(
                [
                    JobSpec("t", depends_on=[dependency.id]),
                    JobSpec("t", {"a": 2}, idempotency_key="k"),
                ],
                conn=conn,
            )
        # The caller's transaction is still usable, and commits its own work only.
        conn.execute("INSERT INTO mine VALUES (1)")
        conn.commit()
    assert _count_jobs(db, schema) == before
    assert queue.dependencies(dependency.id).dependents == []


def test_a_unique_key_on_a_waiting_job_is_held(queue: Queue) -> None:
    dependency = queue.enqueue("t").job
    first = queue.enqueue("t", unique_key="u", depends_on=[dependency.id])
    again = queue.enqueue("t", unique_key="u", depends_on=[dependency.id])
    assert first.created and not again.created and again.job.id == first.job.id
    assert queue.dependencies(dependency.id).dependents == [first.job.id]


def test_concurrent_acks_of_the_last_two_dependencies_release_the_job_exactly_once(
    queue: Queue, db, schema
) -> None:
    protocol = WorkerProtocol(queue)
    for _ in range(20):
        a, b = queue.enqueue("t").job, queue.enqueue("t").job
        dependent = queue.enqueue("after", depends_on=[a.id, b.id]).job
        claimed = _claim_all(queue)
        _in_parallel(partial(protocol.ack, claimed[a.id]), partial(protocol.ack, claimed[b.id]))
        assert queue.get(dependent.id).state is JobState.QUEUED
        assert _pending(db, schema, dependent.id) == 0
        (released,) = _claim_all(queue, "after").values()
        protocol.ack(released)


def test_an_enqueue_racing_the_ack_of_its_dependency_is_never_stranded(
    queue: Queue, db, schema
) -> None:
    protocol = WorkerProtocol(queue)
    for _ in range(30):
        dependency = queue.enqueue("t").job
        (running,) = _claim_all(queue).values()
        _, enqueued = _in_parallel(
            partial(protocol.ack, running),
            partial(queue.enqueue, "after", depends_on=[dependency.id]),
        )
        # Whichever came first, the dependency succeeded: the job must be runnable.
        assert queue.get(enqueued.job.id).state is JobState.QUEUED
        assert _pending(db, schema, enqueued.job.id) == 0
        (released,) = _claim_all(queue, "after").values()
        protocol.ack(released)


def test_an_open_producer_transaction_holds_none_of_its_dependencies(
    queue: Queue, database_url: str, db, schema
) -> None:
    # The producer's transaction stays open while its dependencies are claimed, kept
    # alive, acked and failed: none of them waits for it (a bounded statement time makes
    # a wait fail instead of hang), and its commit then counts each one exactly once.
    bounded = WorkerProtocol(queue.with_statement_timeout(10.0))
    running = queue.enqueue("t").job
    doomed = queue.enqueue("t", max_attempts=1).job
    [claimed_running] = bounded.claim(["default"], ["t"], limit=1, lease_seconds=60)
    [claimed_doomed] = bounded.claim(["default"], ["t"], limit=1, lease_seconds=60)
    queued = queue.enqueue("t").job
    with psycopg.connect(database_url) as conn:
        conn.execute("SELECT 1")  # the caller's transaction, which the enqueues join
        waits = queue.enqueue("after", depends_on=[running.id, queued.id], conn=conn).job
        dies = queue.enqueue("after", depends_on=[doomed.id], conn=conn).job
        assert (waits.state, dies.state) == (JobState.WAITING, JobState.WAITING)

        before = queue.get(running.id).lease_expires_at
        assert (
            bounded.heartbeat([Lease(running.id, claimed_running.lease_token)], lease_seconds=120)
            == set()
        )
        assert queue.get(running.id).lease_expires_at > before
        [claimed_queued] = bounded.claim(["default"], ["t"], limit=1)
        assert claimed_queued.id == queued.id
        assert bounded.ack(claimed_running).state is JobState.SUCCEEDED
        assert bounded.fail(claimed_doomed, "boom").state is JobState.DEAD
        conn.commit()

    assert queue.get(dies.id).state is JobState.CANCELLED
    assert queue.get(dies.id).last_error == f"dependency {doomed.id} ended dead"
    # One dependency left: the one acked before the commit counted once, not twice.
    assert queue.get(waits.id).state is JobState.WAITING
    assert _pending(db, schema, waits.id) == 1
    bounded.ack(claimed_queued)
    assert queue.get(waits.id).state is JobState.QUEUED
    assert _pending(db, schema, waits.id) == 0


def _commit_racing(conn: psycopg.Connection, *calls: Callable[[], Any]) -> list[Any]:
    """Commit ``conn`` and run ``calls``, all released together; their results."""
    return _in_parallel(conn.commit, *calls)[1:]


def test_an_ack_racing_the_producers_commit_is_counted_exactly_once(
    queue: Queue, database_url: str, db, schema
) -> None:
    protocol = WorkerProtocol(queue)
    for _ in range(30):
        first, second = queue.enqueue("t").job, queue.enqueue("t").job
        claimed = _claim_all(queue)
        with psycopg.connect(database_url) as conn:
            dependent = queue.enqueue("after", depends_on=[first.id, second.id], conn=conn).job
            _commit_racing(conn, partial(protocol.ack, claimed[first.id]))
        # Whichever came first, one dependency is left: the job still waits for it.
        assert queue.get(dependent.id).state is JobState.WAITING
        assert _pending(db, schema, dependent.id) == 1
        protocol.ack(claimed[second.id])
        assert queue.get(dependent.id).state is JobState.QUEUED
        assert _pending(db, schema, dependent.id) == 0
        (released,) = _claim_all(queue, "after").values()
        protocol.ack(released)


def test_two_acks_racing_the_producers_commit_queue_the_dependent_once(
    queue: Queue, database_url: str, db, schema
) -> None:
    protocol = WorkerProtocol(queue)
    for _ in range(30):
        first, second = queue.enqueue("t").job, queue.enqueue("t").job
        claimed = _claim_all(queue)
        with psycopg.connect(database_url) as conn:
            dependent = queue.enqueue("after", depends_on=[first.id, second.id], conn=conn).job
            _commit_racing(
                conn,
                partial(protocol.ack, claimed[first.id]),
                partial(protocol.ack, claimed[second.id]),
            )
        assert queue.get(dependent.id).state is JobState.QUEUED
        assert _pending(db, schema, dependent.id) == 0
        (released,) = _claim_all(queue, "after").values()
        protocol.ack(released)


def test_a_dependency_dying_as_the_producer_commits_cancels_the_dependent(
    queue: Queue, database_url: str
) -> None:
    protocol = WorkerProtocol(queue)
    for _ in range(30):
        doomed = queue.enqueue("t", max_attempts=1).job
        (claimed,) = _claim_all(queue).values()
        with psycopg.connect(database_url) as conn:
            dependent = queue.enqueue("after", depends_on=[doomed.id], conn=conn).job
            _commit_racing(conn, partial(protocol.fail, claimed, "boom"))
        cancelled = queue.get(dependent.id)
        assert cancelled.state is JobState.CANCELLED
        assert cancelled.last_error == f"dependency {doomed.id} ended dead"
        assert cancelled.finished_at >= queue.get(doomed.id).finished_at


def test_producers_committing_together_never_deadlock(queue: Queue, database_url: str) -> None:
    # Each producer names the same dependencies, one call at a time, in opposite
    # orders: their commits still lock them in one order, and neither is aborted.
    protocol = WorkerProtocol(queue)
    for _ in range(20):
        a, b = queue.enqueue("t").job, queue.enqueue("t").job
        with psycopg.connect(database_url) as one, psycopg.connect(database_url) as two:
            for conn, order in ((one, (b, a)), (two, (a, b))):
                for dependency in order:
                    queue.enqueue("after", depends_on=[dependency.id], conn=conn)
            _in_parallel(one.commit, two.commit)
        assert len(queue.dependencies(a.id).dependents) == 2
        assert len(queue.dependencies(b.id).dependents) == 2
        for job in _claim_all(queue).values():
            protocol.ack(job)
        assert len(_claim_all(queue, "after")) == 4


def test_pruning_a_dependent_removes_its_links(queue: Queue, db, schema) -> None:
    protocol = WorkerProtocol(queue)
    dependency = queue.enqueue("t").job
    dependent = queue.enqueue("t", depends_on=[dependency.id]).job
    protocol.ack(_claim_all(queue)[dependency.id])
    protocol.ack(_claim_all(queue)[dependent.id])
    queue.prune(older_than=0.0)
    links = sql.SQL("SELECT count(*) FROM {}.job_dependencies").format(sql.Identifier(schema))
    assert db.execute(links).fetchone()[0] == 0


def test_a_queue_whose_jobs_all_wait_can_be_paused(queue: Queue) -> None:
    # The queue exists: it has a job, which stats counts; a pause must not need
    # create=True for it, as it does not for a queue whose jobs are queued.
    protocol = WorkerProtocol(queue)
    dependency = queue.enqueue("t", queue="first").job
    queue.enqueue("t", queue="then", depends_on=[dependency.id])
    assert {stats.queue: stats.counts["waiting"] for stats in queue.stats()}["then"] == 1
    assert queue.pause_queue("then").paused
    assert protocol.claim(["first"], ["t"])[0].id == dependency.id


def test_a_retried_dependent_waits_again_for_what_has_not_succeeded(
    queue: Queue, db, schema
) -> None:
    protocol = WorkerProtocol(queue)
    later = queue.enqueue("t", delay_seconds=3600).job
    done, pending = queue.enqueue("t").job, queue.enqueue("t").job
    dependent = queue.enqueue("after", depends_on=[later.id, done.id, pending.id]).job
    claimed = _claim_all(queue)
    protocol.ack(claimed[done.id])
    queue.cancel(dependent.id)

    retried = queue.retry(dependent.id)

    assert retried.state is JobState.WAITING and retried.attempts == 0
    assert queue.get(dependent.id).state is JobState.WAITING
    assert _pending(db, schema, dependent.id) == 2
    assert _claim_all(queue, "after") == {}
    protocol.ack(claimed[pending.id])
    assert queue.get(dependent.id).state is JobState.WAITING
    assert _pending(db, schema, dependent.id) == 1
    # The delayed dependency, run now, releases it like any other.
    db.execute(
        sql.SQL("UPDATE {}.active_jobs SET run_at = now() WHERE id = %s").format(
            sql.Identifier(schema)
        ),
        (later.id,),
    )
    protocol.ack(_claim_all(queue)[later.id])
    assert queue.get(dependent.id).state is JobState.QUEUED
    assert set(_claim_all(queue, "after")) == {dependent.id}


def test_a_retried_dependent_whose_dependencies_all_succeeded_is_queued(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    dependency = queue.enqueue("t").job
    dependent = queue.enqueue("after", depends_on=[dependency.id], max_attempts=1).job
    protocol.ack(_claim_all(queue)[dependency.id])
    protocol.fail(_claim_all(queue, "after")[dependent.id], "boom")
    assert queue.retry(dependent.id).state is JobState.QUEUED
    assert set(_claim_all(queue, "after")) == {dependent.id}


def test_retrying_a_job_whose_dependency_failed_is_refused_naming_it(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    doomed = queue.enqueue("t", max_attempts=1).job
    cancelled = queue.enqueue("t").job
    fine = queue.enqueue("t").job
    dependent = queue.enqueue("after", depends_on=[doomed.id, cancelled.id, fine.id]).job
    protocol.fail(_claim_all(queue)[doomed.id], "boom")
    queue.cancel(cancelled.id)
    before = queue.get(dependent.id)
    assert before.state is JobState.CANCELLED

    with pytest.raises(DependenciesFailed) as refused:
        queue.retry(dependent.id)

    assert isinstance(refused.value, InvalidTransition)
    assert refused.value.failed == [(doomed.id, "dead"), (cancelled.id, "cancelled")]
    assert str(refused.value) == (
        f"cannot retry job {dependent.id}: its dependencies {doomed.id} (dead) and "
        f"{cancelled.id} (cancelled) will not succeed; retry them first"
    )
    assert queue.get(dependent.id) == before  # nothing changed
    # Once they are retried, so may it be: it waits for them again.
    queue.retry(doomed.id)
    queue.retry(cancelled.id)
    assert queue.retry(dependent.id).state is JobState.WAITING
