"""A worker's statements run under a deadline derived from its lease: one that
overruns is cut off, logged and retried, so no statement can wedge a worker."""

from __future__ import annotations

import threading

import psycopg
import pytest
from polling import wait_for

from pgqueue import JobState, Queue

pytestmark = pytest.mark.timeout(120)


def test_a_worker_retries_an_outcome_whose_statement_overran(
    queue: Queue, database_url: str, run_worker, caplog: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()
    job = queue.enqueue("wait").job

    def wait(payload: dict) -> str:
        release.wait(60)
        return "done"

    # A 6 s lease bounds each of the worker's statements at 3 s.
    worker = run_worker({"wait": wait}, lease_seconds=6.0, heartbeat_seconds=1.0)
    wait_for(lambda: queue.get(job.id).state is JobState.RUNNING, 60, "the job to start")
    with psycopg.connect(database_url) as locker:
        locker.execute(
            f"SELECT 1 FROM {queue.schema}.active_jobs WHERE id = %s FOR UPDATE", [job.id]
        )
        release.set()
        wait_for(
            lambda: "took longer than 3 s" in caplog.text, 60, "the overrunning ack to be cut off"
        )
        assert queue.get(job.id).state is JobState.RUNNING
    # The lock is gone with the locker's transaction: the retried ack goes through.
    wait_for(lambda: queue.get(job.id).state is JobState.SUCCEEDED, 60, "the retried ack")
    assert queue.get(job.id).result == "done"
    assert worker.stop() is True
