"""Every failed attempt leaves an entry in the job's ``errors`` history (attempt, time,
worker, error), capped to the latest ERRORS_KEPT; a success clears ``last_error`` and
keeps the history. Shown by Queue.get, ``pgqueue job`` and (see tests/api) the API."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import psycopg
from psycopg import sql

from pgqueue import JobState, Queue, WorkerProtocol
from pgqueue.job import ERROR_HISTORY_CHARS, ERRORS_KEPT

PGQUEUE = [str(Path(sys.executable).parent / "pgqueue")]


def _claim(queue: Queue, worker_id: str = "w1", **options):
    protocol = WorkerProtocol(queue)
    (job,) = protocol.claim(["default"], ["t"], limit=1, worker_id=worker_id, **options)
    return job


def _runnable_now(db: psycopg.Connection, schema: str) -> None:
    db.execute(sql.SQL("UPDATE {}.active_jobs SET run_at = now()").format(sql.Identifier(schema)))


def _expire_leases(db: psycopg.Connection, schema: str) -> None:
    db.execute(
        sql.SQL(
            "UPDATE {}.active_jobs SET lease_expires_at = now() - interval '1 minute' "
            "WHERE state = 'running'"
        ).format(sql.Identifier(schema))
    )


def test_a_success_clears_last_error_and_keeps_every_failed_attempt(
    queue: Queue, db, schema
) -> None:
    protocol = WorkerProtocol(queue)
    job = queue.enqueue("t", max_attempts=5).job
    assert queue.get(job.id).errors == []

    protocol.fail(_claim(queue, "w1"), RuntimeError("first try broke"))
    _runnable_now(db, schema)
    # A claim hands the worker the history too.
    assert [e["attempt"] for e in _claim(queue, "w2").errors] == [1]
    _expire_leases(db, schema)
    (reaped,) = protocol.reap()
    assert reaped.last_error.startswith("lease expired")
    _runnable_now(db, schema)
    done = protocol.ack(_claim(queue, "w3"), {"ok": True})

    assert done.last_error is None
    stored = queue.get(job.id)
    assert stored.state is JobState.SUCCEEDED and stored.last_error is None
    assert [(e["attempt"], e["worker_id"]) for e in stored.errors] == [(1, "w1"), (2, "w2")]
    assert stored.errors[0]["error"] == "RuntimeError: first try broke"
    assert stored.errors[1]["error"] == reaped.last_error
    first, second = (datetime.fromisoformat(e["failed_at"]) for e in stored.errors)
    assert job.enqueued_at <= first <= second <= stored.finished_at


def test_the_history_keeps_the_latest_attempts_each_cut_to_a_bounded_length(
    queue: Queue, db, schema
) -> None:
    protocol = WorkerProtocol(queue)
    queue.enqueue("t", max_attempts=ERRORS_KEPT + 5)
    long_error = "x" * (ERROR_HISTORY_CHARS + 500)
    for attempt in range(1, ERRORS_KEPT + 6):
        failed = protocol.fail(_claim(queue), f"attempt {attempt} {long_error}")
        _runnable_now(db, schema)
    assert failed.state is JobState.DEAD
    assert [e["attempt"] for e in failed.errors] == list(range(6, ERRORS_KEPT + 6))
    assert all(len(e["error"]) == ERROR_HISTORY_CHARS for e in failed.errors)
    assert failed.errors[-1]["error"].startswith(f"attempt {ERRORS_KEPT + 5} ")
    # last_error keeps the whole text of the latest failure.
    assert failed.last_error == f"attempt {ERRORS_KEPT + 5} {long_error}"


def test_a_retried_job_keeps_the_errors_that_made_it_die(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    job = queue.enqueue("t", max_attempts=1).job
    protocol.fail(_claim(queue), "gave up")
    retried = queue.retry(job.id)
    assert retried.state is JobState.QUEUED
    assert [e["error"] for e in retried.errors] == ["gave up"]


def test_pgqueue_job_shows_the_error_history(queue: Queue, database_url, schema) -> None:
    protocol = WorkerProtocol(queue)
    job = queue.enqueue("t", max_attempts=3).job
    protocol.fail(_claim(queue, "w1"), "no luck")
    out = subprocess.run(
        [*PGQUEUE, "job", str(job.id), "--database-url", database_url, "--schema", schema],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert shown["last_error"] == "no luck"
    [entry] = shown["errors"]
    assert (entry["attempt"], entry["worker_id"], entry["error"]) == (1, "w1", "no luck")
