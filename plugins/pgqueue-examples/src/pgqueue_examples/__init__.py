"""Example pgqueue plugin: four tasks, a weekly schedule and two lifecycle hooks.

Installed, it is found through the ``pgqueue`` entry-point group with no
configuration. The README, docker-compose.yml and the test suite use these tasks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from pgqueue import Job, hookimpl

log = logging.getLogger("pgqueue_examples")


class ExampleFailure(Exception):
    """Raised by the ``fail`` and ``flaky`` tasks."""


def echo(payload: dict[str, Any]) -> dict[str, Any]:
    """Return the payload unchanged."""
    return payload


def sleep(payload: dict[str, Any], job: Job) -> dict[str, float]:
    """Sleep ``payload["seconds"]`` (default 1) and say how long, or stop early when the
    worker calls the attempt off (the job was cancelled, say)."""
    seconds = float(payload.get("seconds", 1))
    started = time.monotonic()
    job.wait_cancelled(seconds)
    return {"slept": seconds if not job.cancelled else round(time.monotonic() - started, 3)}


def fail(payload: dict[str, Any]) -> None:
    """Always raise, with ``payload["message"]`` if given."""
    raise ExampleFailure(payload.get("message", "this task always fails"))


def flaky(payload: dict[str, Any], job: Job) -> dict[str, int]:
    """Raise on the first ``payload["fail_times"]`` attempts, then succeed."""
    fail_times = int(payload.get("fail_times", 1))
    if job.attempts <= fail_times:
        raise ExampleFailure(f"attempt {job.attempts} of {fail_times} planned failures")
    return {"attempts": job.attempts}


TASKS: dict[str, Callable[..., Any]] = {"echo": echo, "sleep": sleep, "fail": fail, "flaky": flaky}


@hookimpl
def register_tasks(register: Callable[..., None]) -> None:
    """Register echo, sleep, fail and flaky."""
    for name, function in TASKS.items():
        register(name, function)


@hookimpl
def register_schedules(register: Callable[..., None]) -> None:
    """Declare ``examples-weekly-echo``: an ``echo`` job every Sunday at 04:00, Berlin time."""
    register(
        "examples-weekly-echo",
        "0 4 * * 0",
        "echo",
        payload={"message": "a weekly hello from pgqueue-examples"},
        timezone="Europe/Berlin",
    )


@hookimpl
def on_fail(job: Job, error: str, next_run_at: datetime | None) -> None:
    """Log each failed attempt of an example task."""
    log.info(
        "example job %s attempt %s failed: %s (next run %s)",
        job.id,
        job.attempts,
        error,
        next_run_at,
    )


@hookimpl
def on_dead(job: Job) -> None:
    """Log each dead example job."""
    log.warning("example job %s (%s) is dead after %s attempts", job.id, job.task, job.attempts)
