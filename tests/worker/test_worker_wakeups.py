"""An idle worker is woken by the jobs enqueued for it, and a wake-up lost in the race
between a worker going idle and a producer enqueueing costs at most one poll interval.

The worker polls every POLL seconds, far longer than a notified pickup takes, so the
two are told apart by how long each job waited for its claim (database clock)."""

from __future__ import annotations

import random
import threading

import psycopg
import pytest
from polling import wait_for

from pgqueue import JobState, Queue

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

POLL = 4.0


def waits_on(db: psycopg.Connection, schema: str, queue_name: str) -> bool:
    """Whether a worker has recorded that it waits on ``queue_name``."""
    return bool(
        db.execute(
            f"SELECT 1 FROM {schema}.waiting_workers WHERE queue = %s AND expires_at > now()",
            [queue_name],
        ).fetchone()
    )


def pickup_seconds(db: psycopg.Connection, schema: str, job_id: int) -> float | None:
    row = db.execute(
        f"SELECT extract(epoch FROM started_at - enqueued_at) FROM {schema}.jobs WHERE id = %s",
        [job_id],
    ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def test_a_job_enqueued_once_the_worker_waits_is_picked_up_by_notification(
    run_worker, queue: Queue, db: psycopg.Connection
) -> None:
    run_worker({"t": lambda payload: None}, poll_interval=POLL)
    for _ in range(10):
        wait_for(lambda: waits_on(db, queue.schema, "default"), 60, "the worker to wait")
        job = queue.enqueue("t").job
        waited = wait_for(lambda j=job: pickup_seconds(db, queue.schema, j.id), 60, "the claim")
        # A poll would have come up to POLL seconds later: this was the notification.
        assert waited < POLL / 2, f"job {job.id} waited {waited:.3f} s"


def test_jobs_enqueued_as_workers_go_idle_wait_at_most_one_poll_interval(
    run_worker, queue: Queue, db: psycopg.Connection
) -> None:
    # Short jobs arriving at random moments: the worker goes idle between them, and
    # some enqueues land exactly while it records that it waits.
    run_worker({"t": lambda payload: None}, poll_interval=POLL, concurrency=2)
    jobs: list[int] = []
    rng = random.Random(7)

    def produce() -> None:
        for _ in range(150):
            jobs.append(queue.enqueue("t").job.id)
            threading.Event().wait(rng.choice((0, 0, 0.001, 0.005, 0.02)))

    producers = [threading.Thread(target=produce) for _ in range(2)]
    for producer in producers:
        producer.start()
    for producer in producers:
        producer.join()

    def all_done() -> bool:
        return all(queue.get(j).state is JobState.SUCCEEDED for j in jobs)

    wait_for(all_done, 120, "every job to succeed")
    waits = [pickup_seconds(db, queue.schema, j) for j in jobs]
    # The bound: a wake-up lost in the race is made up by the next poll.
    assert max(waits) < POLL + 2.0, sorted(waits)[-5:]
