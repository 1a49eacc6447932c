"""WorkerProtocol.ack_and_claim: a worker's acks and its next claim in one transaction,
both or neither, with the acks' hooks run when the caller settles them."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgqueue import (
    DatabaseUnavailable,
    Job,
    JobState,
    LifecycleHooks,
    Queue,
    Waiter,
    WorkerProtocol,
    hookimpl,
)
from pgqueue.plugins import get_plugin_manager

pytestmark = pytest.mark.timeout(120)


class Successes:
    """Records each on_success it is called with."""

    def __init__(self) -> None:
        self.job_ids: list[int] = []

    @hookimpl
    def on_success(self, job: Job, result: Any) -> None:
        self.job_ids.append(job.id)


def hooked(queue: Queue, plugin: object) -> Queue:
    pm = get_plugin_manager(load_entrypoints=False)
    pm.unregister(name="pgqueue.lifecycle_log")
    pm.register(plugin)
    return Queue(queue.pool, schema=queue.schema, hooks=LifecycleHooks(pm))


def test_acks_and_the_next_claim_commit_together_and_hooks_wait_for_settle(queue):
    successes = Successes()
    protocol = WorkerProtocol(hooked(queue, successes))
    first = queue.enqueue("t", {"n": 1}).job
    second = queue.enqueue("t", {"n": 2}).job
    [running] = protocol.claim(["default"], ["t"], limit=1)
    assert running.id == first.id

    acked = protocol.ack_and_claim([(running, {"answer": 42})], ["default"], ["t"], limit=5)

    # Both committed: the first job succeeded, the second is claimed under a lease.
    [claimed] = acked.jobs
    assert claimed.id == second.id and claimed.state is JobState.RUNNING
    assert claimed.attempts == 1 and claimed.lease_token is not None
    stored = queue.get(first.id)
    assert stored.state is JobState.SUCCEEDED and stored.result == {"answer": 42}
    assert queue.get(second.id).lease_token == claimed.lease_token
    # The hooks run when the caller settles the acks, once.
    assert successes.job_ids == []
    batch = acked.settle()
    assert [job.id for job in batch.succeeded] == [first.id] and not batch.lost
    assert batch.succeeded[0].result == {"answer": 42}
    assert acked.settle() is batch
    assert successes.job_ids == [first.id]


def test_an_ack_whose_lease_was_lost_is_refused_and_the_claim_still_happens(queue):
    protocol = WorkerProtocol(queue)
    cancelled_job = queue.enqueue("t", {"n": 1}).job
    waiting = queue.enqueue("t", {"n": 2}).job
    [running] = protocol.claim(["default"], ["t"], limit=1)
    queue.cancel(cancelled_job.id)

    acked = protocol.ack_and_claim([(running, "late")], ["default"], ["t"])

    assert [job.id for job in acked.jobs] == [waiting.id]
    batch = acked.settle()
    assert batch.lost == [cancelled_job.id] and not batch.succeeded
    assert queue.get(cancelled_job.id).state is JobState.CANCELLED


def test_a_result_that_cannot_be_stored_fails_its_attempt_and_the_claim_goes_on(queue):
    protocol = WorkerProtocol(queue)
    first = queue.enqueue("t", {"n": 1}).job
    second = queue.enqueue("t", {"n": 2}).job
    [running] = protocol.claim(["default"], ["t"], limit=1)

    acked = protocol.ack_and_claim([(running, float("nan"))], ["default"], ["t"])

    assert [job.id for job in acked.jobs] == [second.id]
    [failed] = acked.settle().failed
    assert failed.id == first.id and failed.state is JobState.QUEUED
    assert "result could not be stored" in queue.get(first.id).last_error


def test_when_the_claim_fails_the_acks_are_not_written_either(queue, database_url):
    """The claim's statement overruns (its table is locked by another session): the
    whole transaction fails, so the ack it carried was not written, and the lease is
    still held for the caller to write it again."""
    protocol = WorkerProtocol(queue)
    first = queue.enqueue("t", {"n": 1}).job
    second = queue.enqueue("t", {"n": 2}).job
    [running] = protocol.claim(["default"], ["t"], limit=1)
    bounded = WorkerProtocol(queue.with_statement_timeout(1.0))
    waiter = Waiter("test-worker/0", 5.0)

    with psycopg.connect(database_url) as locker:
        # A claim that names a waiter writes queue_waiters; the ack never touches it.
        locker.execute(f"LOCK TABLE {queue.schema}.queue_waiters IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(DatabaseUnavailable, match="took longer than 1 s"):
            bounded.ack_and_claim(
                [(running, {"answer": 42})], ["default"], ["t"], limit=5, waiter=waiter
            )
        locker.rollback()

    stored = queue.get(first.id)
    assert stored.state is JobState.RUNNING and stored.lease_token == running.lease_token
    assert queue.get(second.id).state is JobState.QUEUED
    # The caller still holds the lease: the ack goes through now, claim and all.
    acked = protocol.ack_and_claim([(running, {"answer": 42})], ["default"], ["t"], waiter=waiter)
    assert [job.id for job in acked.jobs] == [second.id]
    assert [job.id for job in acked.settle().succeeded] == [first.id]
    assert queue.get(first.id).result == {"answer": 42}


def test_with_no_acks_it_is_a_plain_claim(queue):
    protocol = WorkerProtocol(queue)
    job = queue.enqueue("t").job
    acked = protocol.ack_and_claim([], ["default"], ["t"])
    assert [claimed.id for claimed in acked.jobs] == [job.id]
    assert acked.settle().succeeded == []
