"""``job.progress()``: a handler's reports land on its job while it runs, coalesced (a
tight loop of reports is not a write each), the last one always, fenced by the lease,
and kept once the job has finished."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import pytest
from polling import wait_for
from worker_support import TEST_PLUGIN, wait_until_state

from pgqueue import Job, JobSpec, JobState, Lease, Queue, ValidationError, WorkerProtocol
from pgqueue_worker.progress import ProgressWriter


def _progress(queue: Queue, job_id: int) -> dict[str, Any] | None:
    return queue.get(job_id).progress_report


@pytest.mark.slow
def test_a_second_report_shows_while_the_job_runs_in_a_worker_process(
    start_worker, queue: Queue
) -> None:
    job = queue.enqueue("report_progress", {"calls": 20000, "wait": 60}).job
    start_worker("--plugin", TEST_PLUGIN, "--concurrency", "1")
    wait_until_state(queue, job.id, JobState.RUNNING)
    first = wait_for(lambda: _progress(queue, job.id), what="the first report")
    assert first["fraction"] == 0.25 and first["message"] == "first"

    def second() -> dict[str, Any] | None:
        shown = _progress(queue, job.id)
        return shown if shown and shown["message"] == "second" else None

    shown = wait_for(second, what="the second report")
    assert shown["fraction"] == 0.5
    running = queue.get(job.id)
    assert running.state is JobState.RUNNING and running.progress_report == shown
    # Kept when the job finishes (here, cancelled).
    cancelled = queue.cancel(job.id)
    assert cancelled.progress_report == shown
    assert queue.get(job.id).progress_report == shown


def test_the_last_report_lands_before_the_outcome_for_plain_and_async_handlers(
    run_worker, queue: Queue
) -> None:
    def plain(payload: dict[str, Any], job: Job) -> None:
        for step in range(1, 50001):
            job.progress(step / 50000, f"row {step}")

    async def coroutine(payload: dict[str, Any], job: Job) -> None:
        for step in range(1, 1001):
            job.progress(step / 1000)
            if step % 100 == 0:
                await asyncio.sleep(0)
        job.progress(1, "all done")

    jobs = [queue.enqueue("plain").job, queue.enqueue("coroutine").job]
    run_worker({"plain": plain, "coroutine": coroutine})
    finished = [wait_until_state(queue, job.id, JobState.SUCCEEDED) for job in jobs]
    assert finished[0].progress_report["fraction"] == 1.0
    assert finished[0].progress_report["message"] == "row 50000"
    assert finished[1].progress_report["fraction"] == 1.0
    assert finished[1].progress_report["message"] == "all done"
    assert finished[1].progress_report["at"] <= finished[1].finished_at.isoformat()


def test_bad_reports_are_refused_and_a_job_outside_a_worker_cannot_report(
    run_worker, queue: Queue
) -> None:
    refusals: list[str] = []
    done = threading.Event()

    def handler(payload: dict[str, Any], job: Job) -> None:
        for fraction, message in (
            (1.5, None),
            (-0.1, None),
            (float("nan"), None),
            (True, None),
            ("0.5", None),
            (0.5, 7),
        ):
            try:
                job.progress(fraction, message)  # type: ignore[arg-type]
            except ValidationError as exc:
                refusals.append(exc.field)
        done.set()

    job = queue.enqueue("bad").job
    run_worker({"bad": handler})
    assert done.wait(30)
    assert refusals == ["fraction"] * 5 + ["message"]
    finished = wait_until_state(queue, job.id, JobState.SUCCEEDED)
    assert finished.progress_report is None
    with pytest.raises(RuntimeError, match="only by the handler a worker runs"):
        finished.progress(0.5)


class CountingProtocol(WorkerProtocol):
    """The real protocol, counting its progress statements."""

    def __init__(self, queue: Queue) -> None:
        super().__init__(queue)
        self.writes = 0

    def write_progress(self, reports: Any) -> list[int]:
        self.writes += 1
        return super().write_progress(reports)


def test_a_tight_loop_of_reports_is_written_at_most_once_per_interval(queue: Queue) -> None:
    queue.enqueue_many([JobSpec("loop"), JobSpec("loop")])
    protocol = CountingProtocol(queue)
    claimed = protocol.claim(["default"], ["loop"], 2)
    leases = [Lease(job.id, job.lease_token) for job in claimed if job.lease_token]
    writer = ProgressWriter(protocol, interval=0.5)
    writer.start()
    try:
        sinks = [writer.sink(lease) for lease in leases]
        started = time.monotonic()
        calls = 0
        while time.monotonic() - started < 2.0:
            for sink in sinks:
                sink(min(1.0, calls / 1e6), f"call {calls}")
            calls += 1
        # Both jobs' reports share each round's statement: one per half second.
        assert calls > 10_000 and protocol.writes <= 2.0 / 0.5 + 1, (calls, protocol.writes)
        for lease in leases:
            settle = writer.settle(lease)
            if settle is not None:
                settle()
        for job in claimed:
            assert queue.get(job.id).progress_report["message"] == f"call {calls - 1}"
    finally:
        writer.stop(5)


def test_a_report_under_a_lost_lease_writes_nothing(queue: Queue) -> None:
    job = queue.enqueue("fenced").job
    protocol = WorkerProtocol(queue)
    [claimed] = protocol.claim(["default"], ["fenced"], 1)
    assert claimed.lease_token is not None
    stale = Lease(job.id, uuid.uuid4())
    assert protocol.write_progress([(stale, 0.9, "stale")]) == []
    assert queue.get(job.id).progress_report is None
    current = Lease(job.id, claimed.lease_token)
    assert protocol.write_progress([(current, 0.3, None)]) == [job.id]
    queue.cancel(job.id)
    assert protocol.write_progress([(current, 0.8, "after the cancel")]) == []
    kept = queue.get(job.id).progress_report
    assert kept is not None and kept["fraction"] == 0.3 and kept["message"] is None
