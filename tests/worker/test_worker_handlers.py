"""Handlers: a worker claims only the tasks it can run, runs plain and async handlers,
and records a result PostgreSQL cannot store as a failed attempt."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from worker_support import wait_until_state

from pgqueue import Job, JobState, Queue, TaskHandler, ValidationError
from pgqueue_worker import Worker, merge_handlers
from pgqueue_worker.handlers import load_handlers


def test_workers_with_different_handler_sets_run_only_their_own_tasks(
    run_worker, queue: Queue
) -> None:
    def which(payload: dict[str, Any]) -> str:
        return threading.current_thread().name

    jobs = [queue.enqueue(task, {"n": n}).job for n in range(6) for task in ("resize", "email")]
    run_worker({"resize": which}, worker_id="resizer")
    run_worker({"email": which}, worker_id="mailer")

    for job in jobs:
        done = wait_until_state(queue, job.id, JobState.SUCCEEDED)
        assert done.worker_id == {"resize": "resizer", "email": "mailer"}[job.task]
        assert done.attempts == 1


def test_a_worker_leaves_tasks_it_has_no_handler_for_queued(run_worker, queue: Queue) -> None:
    foreign = queue.enqueue("not_mine", {}).job
    mine = queue.enqueue("mine", {}).job
    worker = run_worker({"mine": lambda payload: "done"})

    wait_until_state(queue, mine.id, JobState.SUCCEEDED)
    assert worker.stop() is True
    assert queue.get(foreign.id).state is JobState.QUEUED


def test_async_handlers_run_on_the_event_loop_with_the_job(run_worker, queue: Queue) -> None:
    async def describe(payload: dict[str, Any], job: Job) -> dict[str, Any]:
        return {"thread": threading.current_thread().name, "id": job.id, **payload}

    job = queue.enqueue("describe", {"x": 1}).job
    run_worker({"describe": describe})

    done = wait_until_state(queue, job.id, JobState.SUCCEEDED)
    assert done.result == {"thread": "pgqueue-async", "id": job.id, "x": 1}


def test_a_result_postgresql_cannot_store_is_a_failed_attempt(run_worker, queue: Queue) -> None:
    job = queue.enqueue("not_a_number", {}, max_attempts=1).job
    after = queue.enqueue("echo", {"still": "working"}).job
    run_worker({"not_a_number": lambda payload: float("nan"), "echo": lambda payload: payload})

    dead = wait_until_state(queue, job.id, JobState.DEAD)
    assert "result could not be stored" in dead.last_error
    assert wait_until_state(queue, after.id, JobState.SUCCEEDED).result == {"still": "working"}


def test_an_explicit_handler_wins_a_name_clash_with_a_warning(caplog) -> None:
    def from_plugin(payload: dict[str, Any]) -> str:
        return "plugin"

    def explicit(payload: dict[str, Any]) -> str:
        return "explicit"

    discovered = {"echo": TaskHandler("echo", from_plugin, source="some_plugin")}
    chosen = {"echo": TaskHandler("echo", explicit, source="app.tasks:HANDLERS")}

    with caplog.at_level(logging.WARNING, logger="pgqueue.worker"):
        merged = merge_handlers(discovered, chosen)

    assert merged["echo"].function is explicit
    assert (
        "task 'echo' from app.tasks:HANDLERS replaces the one registered by plugin some_plugin"
        in caplog.text
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon_here", "not of the form module:ATTRIBUTE"),
        ("no_such_module_anywhere:X", "cannot import 'no_such_module_anywhere'"),
        ("worker_test_handlers:MISSING", "has no attribute 'MISSING'"),
        ("worker_test_handlers:shout", "not a dict of task name to callable"),
    ],
)
def test_handlers_specs_that_cannot_be_loaded_say_why(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_handlers(spec)


def test_a_worker_needs_a_handler_and_sensible_intervals(queue: Queue) -> None:
    with pytest.raises(ValidationError, match="at least one task handler"):
        Worker(queue, {})
    with pytest.raises(ValidationError, match="shorter than lease_seconds"):
        Worker(queue, {"echo": print}, lease_seconds=1, heartbeat_seconds=1)
    with pytest.raises(ValidationError, match="not callable"):
        Worker(queue, {"echo": "print"})
