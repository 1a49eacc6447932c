"""The order in which a worker's slots take the jobs claimed ahead of them
(pgqueue_worker.waiting_line): partition keys in turns within the highest priority
waiting, each key's jobs in claim order."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime

import pytest

from pgqueue import Job, JobState, Lease, TaskHandler
from pgqueue_worker.claim_loop import keyed_backlog
from pgqueue_worker.executor import Attempt, Executor
from pgqueue_worker.waiting_line import WaitingLine

NOW = datetime(2030, 1, 1, tzinfo=UTC)
HANDLER = TaskHandler("t", lambda payload: None)


def _attempt(
    job_id: int, key: str | None, priority: int = 0, handler: TaskHandler = HANDLER
) -> Attempt:
    job = Job(
        id=job_id, queue="q", task="t", payload={}, priority=priority,
        state=JobState.RUNNING, run_at=NOW, attempts=1, max_attempts=5,
        timeout_seconds=None, lease_token=uuid.uuid4(), lease_expires_at=NOW,
        worker_id="w", enqueued_at=NOW, started_at=NOW, finished_at=None,
        last_error=None, errors=[], result=None, idempotency_key=None,
        partition_key=key,
    )  # fmt: skip
    assert job.lease_token is not None
    return Attempt(
        job=job,
        lease=Lease(job.id, job.lease_token),
        handler=handler,
        is_async=False,
        timeout_seconds=None,
    )


def _drain(line: WaitingLine) -> list[int]:
    order = []
    while line:
        order.append(line.popleft().job.id)
    return order


def test_without_partition_keys_it_is_claim_order() -> None:
    line = WaitingLine()
    for job_id in range(1, 6):
        line.append(_attempt(job_id, None))
    assert len(line) == 5
    assert _drain(line) == [1, 2, 3, 4, 5]
    assert len(line) == 0
    with pytest.raises(IndexError):
        line.popleft()


def test_a_small_tenants_job_claimed_after_a_large_backlog_waits_for_one_turn_only() -> None:
    line = WaitingLine()
    for job_id in range(1, 301):
        line.append(_attempt(job_id, "big"))
    line.append(_attempt(301, "small-1"))
    line.append(_attempt(302, "small-2"))
    line.append(_attempt(303, "small-1"))
    order = _drain(line)
    # Keys in turns, in the order they first arrived; each key's jobs in claim order.
    assert order[:6] == [1, 301, 302, 2, 303, 3]
    assert order[6:] == list(range(4, 301))


def test_jobs_without_a_key_are_one_lane_among_the_keys() -> None:
    line = WaitingLine()
    for job_id, key in [(1, None), (2, None), (3, "a"), (4, "a"), (5, None)]:
        line.append(_attempt(job_id, key))
    assert _drain(line) == [1, 3, 2, 4, 5]


def test_a_higher_priority_goes_first_whatever_the_turns() -> None:
    line = WaitingLine()
    line.append(_attempt(1, "a", priority=0))
    line.append(_attempt(2, "b", priority=0))
    line.append(_attempt(3, "c", priority=5))
    line.append(_attempt(4, "a", priority=5))
    line.append(_attempt(5, "c", priority=5))
    assert _drain(line) == [3, 4, 5, 1, 2]


def test_an_attempt_taken_out_leaves_the_others_in_their_turns() -> None:
    line = WaitingLine()
    attempts = [_attempt(1, "a"), _attempt(2, "b"), _attempt(3, "a"), _attempt(4, "c")]
    for attempt in attempts:
        line.append(attempt)
    line.remove(attempts[1])  # b's only job: b leaves the turns
    assert sorted(a.job.id for a in line) == [1, 3, 4]
    with pytest.raises(ValueError):
        line.remove(attempts[1])
    assert _drain(line) == [1, 4, 3]
    line.append(_attempt(9, "z", priority=3))
    line.clear()
    assert not line and len(line) == 0


def test_the_executors_slots_take_the_keys_in_turns() -> None:
    # A real executor with one slot: the first handler holds it until every attempt is
    # submitted, so the rest wait in the line and run in its order.
    ran: list[int] = []
    release = threading.Event()
    done = threading.Event()

    def work(job: Job) -> None:
        release.wait(10)
        ran.append(job.id)

    handler = TaskHandler("t", work)
    attempts = [_attempt(job_id, "big", handler=handler) for job_id in range(1, 11)]
    attempts += [_attempt(job_id, "small", handler=handler) for job_id in (11, 12)]

    def finished(attempt: Attempt, result: object, error: BaseException | None) -> None:
        assert error is None
        if len(ran) == len(attempts):
            done.set()

    executor = Executor(1, finished)
    executor.start()
    try:
        executor.submit_many(attempts)
        release.set()
        assert done.wait(10)
    finally:
        executor.shutdown()
    assert ran == [1, 2, 11, 3, 12, 4, 5, 6, 7, 8, 9, 10]


def test_a_claim_is_of_a_keyed_backlog_when_any_job_has_a_key() -> None:
    def claim(keys: list[str | None]) -> list[Job]:
        return [_attempt(job_id, key).job for job_id, key in enumerate(keys, 1)]

    # One tenant's backlog alone: the next tenant's first job must not wait for it.
    assert keyed_backlog(claim(["big"] * 10))
    assert keyed_backlog(claim(["big"] * 9 + ["small"]))
    assert keyed_backlog(claim(["big", "small"]))  # a top-up: one job per key
    assert keyed_backlog(claim([None] * 6 + ["a", "a", "b", "b"]))
    # Jobs without a key: no key to make way for, unless the claims before said so
    # (between a small tenant's jobs beside a large keyless backlog).
    assert not keyed_backlog(claim([None] * 10))
    assert keyed_backlog(claim([None] * 10), before=True)
    assert not keyed_backlog([])
    assert not keyed_backlog([], before=True)
