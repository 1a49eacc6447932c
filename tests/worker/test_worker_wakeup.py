"""Wake-up: LISTEN/NOTIFY brings new jobs to an idle worker, a broken listening
connection is replaced, delayed jobs run at their run_at, and polling alone works.

The workers here poll once an hour, so any job they pick up within a test's timeout
was brought to them by a notification or by the wake-up for the next run_at.
"""

from __future__ import annotations

from typing import Any

import psycopg
from polling import wait_for
from worker_support import listening_backends, terminate, wait_until_state

from pgqueue import JobState, Queue

NEVER_POLL = 3600.0


def echo(payload: dict[str, Any]) -> dict[str, Any]:
    return payload


def test_a_notification_wakes_an_idle_worker(
    run_worker, queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    worker = run_worker({"echo": echo}, poll_interval=NEVER_POLL)
    wait_for(lambda: listening_backends(db, schema), what="the worker to LISTEN")

    for n in range(3):
        job = queue.enqueue("echo", {"n": n}).job
        assert wait_until_state(queue, job.id, JobState.SUCCEEDED).result == {"n": n}
    assert worker.worker.counts["succeeded"] == 3


def test_jobs_are_still_picked_up_after_the_listening_connection_is_terminated(
    run_worker, queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    run_worker({"echo": echo}, poll_interval=NEVER_POLL)
    [first_listener] = wait_for(lambda: listening_backends(db, schema), what="a LISTEN")

    terminate(db, [first_listener])
    missed = queue.enqueue("echo", {"sent": "while nobody listened"}).job
    assert wait_until_state(queue, missed.id, JobState.SUCCEEDED).result is not None

    [second_listener] = wait_for(
        lambda: [pid for pid in listening_backends(db, schema) if pid != first_listener],
        what="the worker to LISTEN again",
    )
    assert second_listener != first_listener
    notified = queue.enqueue("echo", {"sent": "to the new listener"}).job
    assert wait_until_state(queue, notified.id, JobState.SUCCEEDED).result is not None


def test_a_delayed_job_runs_once_its_run_at_comes(run_worker, queue: Queue) -> None:
    run_worker({"echo": echo}, poll_interval=NEVER_POLL)

    job = queue.enqueue("echo", {"late": True}, delay_seconds=0.5).job

    done = wait_until_state(queue, job.id, JobState.SUCCEEDED)
    assert done.started_at >= job.run_at


def test_polling_alone_picks_up_jobs_without_listening(
    run_worker, queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    worker = run_worker({"echo": echo}, listen=False, poll_interval=0.1)

    jobs = [queue.enqueue("echo", {"n": n}).job for n in range(3)]

    for job in jobs:
        wait_until_state(queue, job.id, JobState.SUCCEEDED)
    assert listening_backends(db, schema) == []
    assert worker.stop() is True


def test_a_job_enqueued_just_as_the_worker_goes_idle_is_still_picked_up(
    run_worker, queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    # Each job is enqueued the moment the previous one finished: when the worker's
    # claims come back short and it records itself as waiting again, the window in which
    # an enqueue can miss its notification. A miss must be made up by the next poll, so
    # every job is picked up; the wait allows for a poll and a busy machine.
    poll = 2.0
    run_worker({"echo": echo}, poll_interval=poll)
    wait_for(lambda: listening_backends(db, schema), what="the worker to LISTEN")
    for n in range(60):
        job = queue.enqueue("echo", {"n": n}).job
        done = wait_until_state(queue, job.id, JobState.SUCCEEDED, timeout=poll + 30)
        assert done.result == {"n": n}
