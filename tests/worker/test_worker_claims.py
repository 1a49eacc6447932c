"""The claimer: claims run on a thread of their own, and none is abandoned on the way."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
from polling import wait_for
from psycopg import sql

from pgqueue import JobSpec, JobState, Queue


def claims_waiting_for_a_lock(db: psycopg.Connection) -> int:
    """Claim statements of this database that wait for a lock right now (known by how
    job_claim begins: pg_stat_activity keeps only a statement's first kilobyte)."""
    return db.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        " AND query LIKE %s",
        ("WITH room AS MATERIALIZED (%",),
    ).fetchone()[0]


def test_a_worker_stopped_during_a_claim_runs_the_jobs_that_claim_brings(
    run_worker, queue: Queue, database_url: str, db: psycopg.Connection
) -> None:
    """The claim commits on the server whatever the worker does meanwhile: a worker that
    returned before it came back would leave its jobs to their leases."""
    jobs = queue.enqueue_many([JobSpec("echo", {"n": n}) for n in range(5)])
    ran: list[int] = []
    lock = threading.Lock()

    def echo(payload: dict[str, Any]) -> dict[str, Any]:
        with lock:
            ran.append(payload["n"])
        return payload

    with psycopg.connect(database_url) as holder:
        # Holds the claim's UPDATE at the table lock until the worker has been told to stop.
        holder.execute(
            sql.SQL("LOCK TABLE {}.jobs IN EXCLUSIVE MODE").format(sql.Identifier(queue.schema))
        )
        running = run_worker({"echo": echo}, listen=False, lease_seconds=30)
        wait_for(lambda: claims_waiting_for_a_lock(db) == 1, what="the claim to wait for the lock")
        running.worker.stop()
        holder.commit()

    assert running.stop() is True
    assert sorted(ran) == list(range(5))
    for result in jobs:
        done = queue.get(result.job.id)
        assert (done.state, done.attempts) == (JobState.SUCCEEDED, 1), done
