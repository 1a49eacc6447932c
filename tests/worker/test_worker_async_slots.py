"""Coroutine handlers have slots of their own: by default far more of them run at once
than there are threads for plain handlers, their limit holds, the thread limit still
holds beside them, and a backlog of either kind never keeps the other's jobs waiting."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from polling import wait_for
from worker_async_handlers import GATE_VARIABLE
from worker_support import Overlap, wait_until_state

from pgqueue import JobSpec, JobState, Queue

pytestmark = pytest.mark.slow


def running_jobs(db: psycopg.Connection, schema: str, task: str) -> int:
    (count,) = db.execute(
        f"SELECT count(*) FROM \"{schema}\".jobs WHERE state = 'running' AND task = %s", (task,)
    ).fetchone()
    return count


def gated_coroutine(overlap: Overlap, gate: threading.Event):
    async def handler(payload: dict[str, Any]) -> None:
        overlap.enter()
        try:
            while not gate.is_set():
                await asyncio.sleep(0.01)
        finally:
            overlap.leave()

    return handler


def gated_function(overlap: Overlap, gate: threading.Event):
    def handler(payload: dict[str, Any]) -> None:
        overlap.enter()
        try:
            gate.wait(60)
        finally:
            overlap.leave()

    return handler


def test_by_default_async_jobs_run_far_beyond_the_thread_slots_at_once(
    run_worker, queue: Queue
) -> None:
    coroutines, gate = Overlap(), threading.Event()
    ids = [r.job.id for r in queue.enqueue_many([JobSpec("gated", {}) for _ in range(300)])]
    worker = run_worker({"gated": gated_coroutine(coroutines, gate)})
    assert worker.worker.concurrency == 32  # the thread slots stay as they were

    try:
        wait_for(lambda: coroutines.now == 300, 30, what="all 300 coroutines to run at once")
    finally:
        gate.set()
    for job_id in ids:
        wait_until_state(queue, job_id, JobState.SUCCEEDED)
    assert worker.stop() is True
    assert coroutines.most == 300


def test_pgqueue_worker_runs_async_jobs_far_beyond_its_thread_slots_with_default_flags(
    start_worker, queue: Queue, db: psycopg.Connection, schema: str, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    ids = [r.job.id for r in queue.enqueue_many([JobSpec("gated", {}) for _ in range(200)])]
    worker = start_worker(
        "--handlers", "worker_async_handlers:GATED", env={GATE_VARIABLE: str(gate)}
    )
    # No job has ended, so nothing is claimed ahead of free slots: every running job
    # holds a coroutine slot.
    wait_for(
        lambda: running_jobs(db, schema, "gated") == 200,
        30,
        what="all 200 jobs running at once",
    )
    gate.touch()
    for job_id in ids:
        wait_until_state(queue, job_id, JobState.SUCCEEDED)
    worker.wait_for_log("1000 slots for async handlers")


def test_the_async_limit_holds_and_so_does_the_thread_limit_beside_it(
    run_worker, queue: Queue
) -> None:
    threads, coroutines, gate = Overlap(), Overlap(), threading.Event()
    specs = [JobSpec("plain", {}) for _ in range(20)] + [JobSpec("coro", {}) for _ in range(200)]
    ids = [r.job.id for r in queue.enqueue_many(specs)]
    worker = run_worker(
        {"plain": gated_function(threads, gate), "coro": gated_coroutine(coroutines, gate)},
        concurrency=4,
        async_concurrency=50,
    )
    try:
        wait_for(
            lambda: (threads.now, coroutines.now) == (4, 50),
            30,
            what="4 plain and 50 async handlers to run at once",
        )
    finally:
        gate.set()
    for job_id in ids:
        wait_until_state(queue, job_id, JobState.SUCCEEDED)
    assert worker.stop() is True
    # Once the gate opened, the rest ran through the same slots: never more at once.
    assert (threads.most, coroutines.most) == (4, 50)


@pytest.mark.parametrize("backlog", ["plain", "coro"])
def test_a_backlog_of_one_kind_does_not_keep_the_other_kind_waiting(
    backlog: str, run_worker, queue: Queue
) -> None:
    """The backlog's jobs come first in claim order (higher priority) and hold their
    slots until the end of the test; the other kind's jobs still all run meanwhile."""
    overlap, gate = Overlap(), threading.Event()
    ran: list[str] = []

    def quick_function(payload: dict[str, Any]) -> None:
        ran.append("plain")

    async def quick_coroutine(payload: dict[str, Any]) -> None:
        ran.append("coro")

    if backlog == "plain":
        handlers = {"plain": gated_function(overlap, gate), "coro": quick_coroutine}
    else:
        handlers = {"plain": quick_function, "coro": gated_coroutine(overlap, gate)}
    other = "coro" if backlog == "plain" else "plain"
    # Many more than the backlog's kind has slots for, even claiming ahead.
    queue.enqueue_many([JobSpec(backlog, {}, priority=10) for _ in range(600)])
    others = [r.job.id for r in queue.enqueue_many([JobSpec(other, {}) for _ in range(20)])]
    slots = 4 if backlog == "plain" else 40
    worker = run_worker(handlers, concurrency=4, async_concurrency=40)
    try:
        wait_for(lambda: overlap.now == slots, 30, what=f"the backlog to fill its {slots} slots")
        # The gate is closed: the backlog holds every slot of its kind all along.
        for job_id in others:
            wait_until_state(queue, job_id, JobState.SUCCEEDED, timeout=30)
        assert ran == [other] * 20
    finally:
        gate.set()
    wait_for(lambda: worker.worker.counts["succeeded"] == 620, 120, what="the backlog to drain")
    assert worker.stop() is True
    assert overlap.most == slots
