"""Database trouble: the worker logs it once, backs off, keeps going, and neither loses
nor double-acks a job."""

from __future__ import annotations

import logging
import threading
from typing import Any

import psycopg
import pytest
from polling import wait_for
from psycopg import sql
from worker_support import terminate, wait_until_state, worker_backends

from pgqueue import Job, JobState, LifecycleHooks, Queue, get_plugin_manager, hookimpl
from pgqueue_worker import connections

WORKER_CONNECTIONS = ("pgqueue-worker", "pgqueue-worker-heartbeat", "pgqueue-worker-listen")


class SuccessRecorder:
    """A plugin counting on_success calls per job."""

    def __init__(self) -> None:
        self.succeeded: list[int] = []

    @hookimpl
    def on_success(self, job: Job) -> None:
        self.succeeded.append(job.id)


@pytest.fixture
def recorded_queue(database_url: str, schema: str):
    """A Queue for the worker, on the pool ``pgqueue worker`` would open (its connections
    named like a worker's, so the test can cut them), whose hooks include a
    SuccessRecorder. The test itself watches through the ``queue`` fixture."""
    pm = get_plugin_manager(load_entrypoints=False)
    recorder = SuccessRecorder()
    pm.register(recorder, name="success-recorder")
    queue = Queue(connections.open_pool(database_url), schema=schema, hooks=LifecycleHooks(pm))
    try:
        yield queue, recorder
    finally:
        queue.close()


def outage_lines(caplog) -> list[str]:
    """The outage and recovery lines logged so far, shortened to what they say."""
    said = []
    for record in caplog.records:
        for line in ("database unavailable", "database available again"):
            if record.getMessage().startswith(line):
                said.append(line)
    return said


def worker_pids(db: psycopg.Connection) -> list[int]:
    return [pid for name in WORKER_CONNECTIONS for pid in worker_backends(db, name)]


def test_the_worker_rides_out_terminated_connections(
    recorded_queue, run_worker, queue: Queue, db: psycopg.Connection, caplog
) -> None:
    worker_queue, recorder = recorded_queue
    release = threading.Event()

    def wait_then_echo(payload: dict[str, Any]) -> dict[str, Any]:
        release.wait(60)
        return payload

    job = queue.enqueue("wait_then_echo", {"n": 1}).job
    worker = run_worker({"wait_then_echo": wait_then_echo}, on=worker_queue)
    wait_until_state(queue, job.id, JobState.RUNNING)

    with caplog.at_level(logging.WARNING, logger="pgqueue.worker"):
        terminate(db, wait_for(lambda: worker_pids(db), what="the worker's connections"))
        release.set()
        done = wait_until_state(queue, job.id, JobState.SUCCEEDED)
        later = queue.enqueue("wait_then_echo", {"n": 2}).job
        wait_until_state(queue, later.id, JobState.SUCCEEDED)

    assert done.attempts == 1
    assert recorder.succeeded == [job.id, later.id]
    assert worker.stop() is True


def test_an_ack_refused_by_a_read_only_database_is_written_once_it_accepts_writes(
    recorded_queue, run_worker, queue: Queue, db: psycopg.Connection, caplog
) -> None:
    worker_queue, recorder = recorded_queue
    release = threading.Event()

    def wait_then_echo(payload: dict[str, Any]) -> dict[str, Any]:
        release.wait(60)
        return payload

    database = sql.Identifier(db.info.dbname)
    job = queue.enqueue("wait_then_echo", {"n": 1}).job
    running = run_worker({"wait_then_echo": wait_then_echo}, on=worker_queue, lease_seconds=30)
    worker = running.worker
    wait_until_state(queue, job.id, JobState.RUNNING)

    with caplog.at_level(logging.WARNING, logger="pgqueue.worker"):
        try:
            db.execute(
                sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on").format(database)
            )
            terminate(db, worker_pids(db))  # reconnecting, the worker gets read-only sessions
            release.set()
            wait_for(lambda: worker.running_jobs == 0, what="the handler to return")
            # Every claim-loop round from now on carries the ack; wait for one refused.
            refused_before = worker.counts["database_errors"]
            wait_for(
                lambda: worker.counts["database_errors"] > refused_before,
                what="the ack to be refused",
            )
            assert queue.get(job.id).state is JobState.RUNNING
            # Connection errors, then refusals from the claim loop, the heartbeat and the
            # reaper, again and again: one outage, logged once.
            assert outage_lines(caplog) == ["database unavailable"]
        finally:
            db.execute(
                sql.SQL("ALTER DATABASE {} RESET default_transaction_read_only").format(database)
            )
        terminate(db, worker_pids(db))  # for sessions that accept writes again
        done = wait_until_state(queue, job.id, JobState.SUCCEEDED)
        wait_for(lambda: "database available again" in outage_lines(caplog), what="recovery")

    assert done.attempts == 1
    assert done.result == {"n": 1}
    assert recorder.succeeded == [job.id]
    assert running.stop() is True
