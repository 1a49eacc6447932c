"""A worker with nothing running sends its finished jobs' acks with its next claim, in
one transaction: one commit per job where two would do the same work. Its hooks still
run for every job, and a failure still goes through the outcome writer."""

from __future__ import annotations

import itertools
from typing import Any

import psycopg
import pytest
from test_worker_hook_timing import Events, hooked

from pgqueue import Job, JobSpec, JobState, Queue, hookimpl

pytestmark = pytest.mark.slow


class Recorder:
    def __init__(self) -> None:
        self.events = Events()

    @hookimpl
    def on_success(self, job: Job, result: Any) -> None:
        self.events.add("success", job)

    @hookimpl
    def on_fail(self, job: Job, error: str, next_run_at: Any) -> None:
        self.events.add("fail", job)


def test_each_ack_commits_with_the_next_claim(
    run_worker, queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    recorder = Recorder()
    specs = [JobSpec("t", {"n": n}, max_attempts=1 if n == 10 else 5) for n in range(30)]
    jobs = [result.job for result in queue.enqueue_many(specs)]

    def handler(payload: dict[str, Any]) -> dict[str, int]:
        if payload["n"] == 10:
            raise RuntimeError("the eleventh job fails")
        return {"n": payload["n"]}

    worker = run_worker(
        {"t": handler}, on=hooked(queue, recorder), concurrency=1, prefetch=0, burst=True
    )
    worker.thread.join(120)
    assert not worker.thread.is_alive() and worker.clean is True

    rows = db.execute(
        f'SELECT id, state, attempts, started_at, finished_at FROM "{schema}".jobs ORDER BY id'
    ).fetchall()
    assert [row[0] for row in rows] == [job.id for job in jobs]
    assert [(row[1], row[2]) for row in rows] == [
        ("dead" if n == 10 else "succeeded", 1) for n in range(30)
    ]
    # A success's ack and the claim of the next job share a transaction, so its
    # finished_at is the next job's started_at (both the transaction's now()). The
    # failure went through the outcome writer, in a transaction of its own.
    apart = [
        n for n, (before, after) in enumerate(itertools.pairwise(rows)) if before[4] != after[3]
    ]
    assert apart == [10], [(row[0], row[3], row[4]) for row in rows]
    succeeded = [job.id for n, job in enumerate(jobs) if n != 10]
    assert sorted(recorder.events.of("success")) == succeeded
    assert recorder.events.of("fail") == [jobs[10].id]
    assert queue.get(jobs[10].id).state is JobState.DEAD
