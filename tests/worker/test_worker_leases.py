"""Leases: a job whose worker died or stalled runs again, and an outcome written under a
lost lease never lands; per-job timeouts fail the attempt and discard the late result."""

from __future__ import annotations

import asyncio
import signal
import threading
from typing import Any

import pytest
from polling import wait_for
from worker_support import FAST, TEST_PLUGIN, wait_until_state

from pgqueue import Job, JobState, Queue, TaskHandler

pytestmark = pytest.mark.slow


def test_a_killed_workers_job_runs_again_after_its_lease_expires(
    start_worker, queue: Queue
) -> None:
    job = queue.enqueue("stall_first", {}).job
    first = start_worker(*FAST, "--plugin", TEST_PLUGIN)
    wait_until_state(queue, job.id, JobState.RUNNING)

    first.signal(signal.SIGKILL)
    first.wait()
    second = start_worker(*FAST, "--plugin", TEST_PLUGIN)

    done = wait_until_state(queue, job.id, JobState.SUCCEEDED)
    assert done.attempts == 2
    assert done.result == {"attempt": 2, "pid": second.pid}
    # A success clears last_error; the history keeps the attempt that was reaped.
    assert done.last_error is None
    [reaped] = done.errors
    assert reaped["attempt"] == 1 and reaped["error"].startswith("lease expired")


def test_a_stalled_workers_late_ack_is_rejected(start_worker, queue: Queue) -> None:
    # Attempt 1 takes 3 s, long enough to be stopped in the middle of it.
    job = queue.enqueue("stall_first", {"stall": 3}).job
    stalled = start_worker(*FAST, "--plugin", TEST_PLUGIN)
    wait_until_state(queue, job.id, JobState.RUNNING)
    stalled.signal(signal.SIGSTOP)  # past its 1 s lease: no heartbeat, no ack

    rescuer = start_worker(*FAST, "--plugin", TEST_PLUGIN)
    done = wait_until_state(queue, job.id, JobState.SUCCEEDED)
    assert done.result == {"attempt": 2, "pid": rescuer.pid}

    stalled.signal(signal.SIGCONT)  # its handler returns, and it tries to ack attempt 1
    stalled.wait_for_log("outcome discarded")

    after = queue.get(job.id)
    assert (after.state, after.attempts) == (JobState.SUCCEEDED, 2)
    assert after.result == {"attempt": 2, "pid": rescuer.pid}
    assert after.finished_at == done.finished_at


def test_a_cancelled_jobs_outcome_is_discarded(run_worker, queue: Queue) -> None:
    release = threading.Event()

    def wait_for_release(payload: dict[str, Any]) -> dict[str, str]:
        release.wait(60)
        return {"finished": "anyway"}

    job = queue.enqueue("blocking", {}).job
    worker = run_worker({"blocking": wait_for_release})
    wait_until_state(queue, job.id, JobState.RUNNING)

    queue.cancel(job.id)
    wait_for(lambda: worker.worker.counts["lost"] == 1, what="the heartbeat to report the loss")
    release.set()
    assert worker.stop() is True

    cancelled = queue.get(job.id)
    assert cancelled.state is JobState.CANCELLED
    assert cancelled.result is None
    assert worker.worker.counts["succeeded"] == 0


def test_a_job_timeout_fails_the_attempt_and_discards_the_late_result(
    run_worker, queue: Queue
) -> None:
    first_attempt_returned = threading.Event()

    def slow_first(payload: dict[str, Any], job: Job) -> dict[str, int]:
        if job.attempts == 1:
            first_attempt_returned.wait(1.5)  # well past the job's timeout
            first_attempt_returned.set()
        return {"attempt": job.attempts}

    queue.retry_base = 0.05
    job = queue.enqueue("slow_first", {}, timeout_seconds=0.3, max_attempts=3).job
    worker = run_worker({"slow_first": slow_first}, concurrency=2)

    done = wait_until_state(queue, job.id, JobState.SUCCEEDED)
    first_attempt_returned.wait(30)
    wait_for(lambda: worker.worker.running_jobs == 0, what="the timed-out handler to return")
    assert worker.stop() is True

    after = queue.get(job.id)
    assert (after.attempts, after.result) == (2, {"attempt": 2})
    assert after.last_error is None
    assert [e["error"] for e in after.errors] == ["timed out after 0.3 s"]
    assert after.finished_at == done.finished_at
    assert worker.worker.counts["timed_out"] == 1


def test_a_tasks_default_timeout_cancels_an_async_handler(run_worker, queue: Queue) -> None:
    cancelled = threading.Event()

    async def hang(payload: dict[str, Any]) -> None:
        try:
            await asyncio.sleep(120)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    job = queue.enqueue("hang", {}, max_attempts=1).job
    run_worker({"hang": TaskHandler("hang", hang, timeout_seconds=0.2)})

    dead = wait_until_state(queue, job.id, JobState.DEAD)
    assert dead.last_error == "timed out after 0.2 s"
    assert cancelled.wait(30)
