"""A plain-function handler cannot be interrupted, so the worker tells it when it calls
its attempt off: ``job.cancelled`` turns True and ``job.wait_cancelled`` returns, once
the job is cancelled (the heartbeat finds the lease gone) or the attempt times out."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from polling import wait_for
from worker_support import FAST, wait_until_state

from pgqueue import Job, JobState, Queue


def test_a_sync_handler_sees_its_job_cancelled(run_worker, queue: Queue) -> None:
    noticed = threading.Event()

    def poll_until_cancelled(payload: dict[str, Any], job: Job) -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if job.cancelled:
                noticed.set()
                return "stopped early"
            time.sleep(0.01)
        return "never told"

    job = queue.enqueue("long", {}).job
    later = queue.enqueue("echo", {"after": True}).job
    worker = run_worker(
        {"long": poll_until_cancelled, "echo": lambda payload: payload}, concurrency=1
    )
    wait_until_state(queue, job.id, JobState.RUNNING)
    assert not noticed.is_set()
    queue.cancel(job.id)

    assert noticed.wait(30), "the handler was not told its job was cancelled"
    # The slot is free again for the next job, and the cancelled job stays cancelled.
    assert wait_until_state(queue, later.id, JobState.SUCCEEDED).result == {"after": True}
    cancelled = queue.get(job.id)
    assert cancelled.state is JobState.CANCELLED and cancelled.result is None
    wait_for(lambda: worker.worker.counts["lost"] == 1, what="the discarded outcome")
    assert worker.stop() is True


def test_wait_cancelled_wakes_a_waiting_handler_when_its_job_is_cancelled(
    run_worker, queue: Queue
) -> None:
    woke: list[tuple[bool, bool]] = []

    def wait(payload: dict[str, Any], job: Job) -> None:
        woke.append((job.wait_cancelled(60), job.cancelled))

    job = queue.enqueue("wait", {}).job
    run_worker({"wait": wait})
    wait_until_state(queue, job.id, JobState.RUNNING)
    queue.cancel(job.id)
    wait_for(lambda: woke, timeout=30, what="the handler to wake")
    assert woke == [(True, True)]


def test_a_sync_handler_that_overruns_its_time_limit_is_told(run_worker, queue: Queue) -> None:
    told = threading.Event()

    def overrun(payload: dict[str, Any], job: Job) -> None:
        if job.wait_cancelled(60):
            told.set()

    job = queue.enqueue("overrun", {}, timeout_seconds=0.3, max_attempts=1).job
    run_worker({"overrun": overrun})
    dead = wait_until_state(queue, job.id, JobState.DEAD)
    assert "timed out" in dead.last_error
    assert told.wait(30)


def test_handlers_still_running_when_the_shutdown_timeout_ends_are_told(
    run_worker, queue: Queue
) -> None:
    told = threading.Event()

    def wait(payload: dict[str, Any], job: Job) -> None:
        if job.wait_cancelled(60):
            told.set()

    job = queue.enqueue("wait", {}).job
    worker = run_worker({"wait": wait}, shutdown_timeout=0.2)
    wait_until_state(queue, job.id, JobState.RUNNING)
    assert worker.stop() is False  # the job is left to its lease
    assert told.wait(30)


def test_a_job_no_worker_runs_is_not_cancelled(queue: Queue) -> None:
    job = queue.enqueue("task", {}).job
    assert job.cancelled is False
    assert job.wait_cancelled(0) is False
    job.mark_cancelled()
    assert job.cancelled is True and job.wait_cancelled(0) is True


def test_the_example_sleep_task_stops_when_its_job_is_cancelled(start_worker, queue: Queue) -> None:
    job = queue.enqueue("sleep", {"seconds": 600}).job
    worker = start_worker(*FAST)
    wait_until_state(queue, job.id, JobState.RUNNING)
    queue.cancel(job.id)

    # The handler returned (its outcome discarded) long before its 600 s were up...
    worker.wait_for_log(f"job {job.id} attempt 1 returned after it was lost its lease")
    # ...so the worker has nothing left to wait for and stops at once.
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert queue.get(job.id).state is JobState.CANCELLED
