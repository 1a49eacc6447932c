"""Prefetch: a worker claims short jobs ahead of its free slots, in batches larger than
its concurrency, yet never runs more handlers at once than it has slots; long jobs are
not claimed ahead; a job claimed ahead gets its whole time limit once a slot starts it,
and one whose lease is lost while it waits never runs."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import datetime
from typing import Any

import psycopg
import pytest
from polling import wait_for
from worker_support import Overlap, wait_until_state

from pgqueue import JobSpec, JobState, Queue

pytestmark = pytest.mark.slow


def claim_batches(db: psycopg.Connection, schema: str) -> list[int]:
    """Sizes of the claims that started the jobs: one claim statement gives every job
    it claims the same started_at (the clock the claim read once)."""
    rows = db.execute(
        f'SELECT count(*) FROM "{schema}".jobs GROUP BY worker_id, started_at ORDER BY 1 DESC'
    ).fetchall()
    return [row[0] for row in rows]


def test_short_jobs_are_claimed_ahead_yet_no_more_than_concurrency_run_at_once(
    run_worker, queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    threads, coroutines = Overlap(), Overlap()

    def plain(payload: dict[str, Any]) -> None:
        threads.enter()
        time.sleep(0.001)
        threads.leave()

    async def coroutine(payload: dict[str, Any]) -> None:
        coroutines.enter()
        await asyncio.sleep(0.001)
        coroutines.leave()

    specs = [JobSpec("plain" if n % 2 else "coroutine", {"n": n}) for n in range(1200)]
    queue.enqueue_many(specs)
    worker = run_worker(
        {"plain": plain, "coroutine": coroutine}, concurrency=4, async_concurrency=3, burst=True
    )
    worker.thread.join(120)
    assert not worker.thread.is_alive() and worker.clean is True

    assert worker.worker.counts["succeeded"] == 1200
    # Each kind up to its own slots: four threads, three coroutines.
    assert (threads.most, coroutines.most) == (4, 3)
    batches = claim_batches(db, schema)
    assert sum(batches) == 1200
    assert batches[0] > 4 * 4, f"no claim much beyond the 4 slots: {batches[:5]}"


def test_long_jobs_are_not_claimed_ahead(
    run_worker, queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    clock = threading.Lock()
    ended: list[datetime] = []

    def nap(payload: dict[str, Any]) -> None:
        time.sleep(0.3)
        with clock:  # the handlers share one connection to read the database clock
            (now,) = db.execute("SELECT clock_timestamp()").fetchone()
            ended.append(now)

    ids = [r.job.id for r in queue.enqueue_many([JobSpec("nap", {}) for _ in range(8)])]
    worker = run_worker({"nap": nap}, concurrency=2)
    for job_id in ids:
        wait_until_state(queue, job_id, JobState.SUCCEEDED, timeout=60)
    assert worker.stop() is True

    # 0.3 s jobs on two slots: fewer than one of them would start within the 0.1 s
    # horizon, so the worker claims only for free slots. Then, when any claim ran
    # (started_at, its transaction's time), the jobs claimed so far can be at most the
    # two slots plus the handlers that had ended. Both sides are read on the database
    # clock. (Counting rows in state 'running' would not tell: the outcome writer may
    # still be acking the jobs whose slots the new claim filled.)
    claims = sorted(queue.get(job_id).started_at for job_id in ids)
    for claim in claims:
        claimed = sum(1 for other in claims if other <= claim)
        freed = sum(1 for end in ended if end < claim)
        assert claimed <= 2 + freed, f"claim at {claim}: {claimed} claimed, {freed} ended"
    assert max(claim_batches(db, schema)) <= 2


def test_a_job_claimed_ahead_gets_its_whole_time_limit_once_it_starts(
    run_worker, queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    def quick(payload: dict[str, Any]) -> None:
        return None

    def nap(payload: dict[str, Any]) -> None:
        time.sleep(0.15)

    # The quick jobs go first (higher priority) and teach the worker that handlers are
    # short, so its next claim takes the naps too: they queue up behind one slot for
    # up to 0.6 s, longer than their 0.4 s limit, which must count from their start.
    queue.enqueue_many([JobSpec("quick", {}, priority=1) for _ in range(20)])
    naps = queue.enqueue_many([JobSpec("nap", {}, timeout_seconds=0.4) for _ in range(5)])
    worker = run_worker({"quick": quick, "nap": nap}, concurrency=1, burst=True)
    worker.thread.join(60)
    assert not worker.thread.is_alive() and worker.clean is True

    done = [queue.get(r.job.id) for r in naps]
    assert [(job.state, job.attempts) for job in done] == [(JobState.SUCCEEDED, 1)] * 5
    assert worker.worker.counts["timed_out"] == 0
    # The premise: the naps were claimed together, ahead of the one slot.
    assert len({job.started_at for job in done}) < 5


def test_a_job_whose_lease_is_lost_while_it_waits_for_a_slot_never_runs(
    run_worker, queue: Queue
) -> None:
    release = threading.Event()
    ran: list[str] = []

    def quick(payload: dict[str, Any]) -> None:
        return None

    def block(payload: dict[str, Any]) -> None:
        ran.append("block")
        release.wait(60)

    def waiting(payload: dict[str, Any]) -> None:
        ran.append("waiting")

    queue.enqueue_many([JobSpec("quick", {}, priority=2) for _ in range(5)])
    blocker = queue.enqueue("block", {}, priority=1).job
    waiter = queue.enqueue("waiting", {}).job
    worker = run_worker({"quick": quick, "block": block, "waiting": waiting}, concurrency=1)

    wait_until_state(queue, blocker.id, JobState.RUNNING)
    wait_until_state(queue, waiter.id, JobState.RUNNING)  # claimed ahead, behind the blocker
    queue.cancel(waiter.id)
    wait_for(lambda: worker.worker.counts["lost"] == 1, what="the heartbeat to report the loss")
    release.set()
    wait_until_state(queue, blocker.id, JobState.SUCCEEDED)
    assert worker.stop() is True

    assert ran == ["block"]
    assert queue.get(waiter.id).state is JobState.CANCELLED
