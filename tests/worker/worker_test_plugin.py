"""A pgqueue plugin for the worker tests, loaded with ``pgqueue worker --plugin``.

Its hooks append one JSON line per call to the file named by ``PGQUEUE_TEST_HOOK_LOG``
(single ``O_APPEND`` writes, so several worker processes can share the file), and,
with ``PGQUEUE_TEST_RAISING_HOOKS=1``, raise after recording. Its tasks misbehave on
purpose: ``stall_first`` hangs on its first attempt, ``whoami`` says which process
ran it, ``report_progress`` reports its progress in a tight loop and then waits to be
cancelled.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from pgqueue import Job, hookimpl


class HookFailure(Exception):
    """Raised by every hook when PGQUEUE_TEST_RAISING_HOOKS is set."""


def _record(hook: str, job: Job, **details: Any) -> None:
    line = json.dumps(
        {
            "hook": hook,
            "job_id": job.id,
            "task": job.task,
            "attempt": job.attempts,
            "state": job.state.value,
            "pid": os.getpid(),
            **details,
        },
        default=str,
    )
    path = os.environ.get("PGQUEUE_TEST_HOOK_LOG")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    if os.environ.get("PGQUEUE_TEST_RAISING_HOOKS"):
        raise HookFailure(f"{hook} raised on purpose")


def stall_first(payload: dict[str, Any], job: Job) -> dict[str, Any]:
    """Hang for ``payload["stall"]`` seconds (default 120) on the first attempt only."""
    if job.attempts == 1:
        time.sleep(float(payload.get("stall", 120)))
    return {"attempt": job.attempts, "pid": os.getpid()}


def whoami(payload: dict[str, Any], job: Job) -> dict[str, Any]:
    """Sleep ``payload["seconds"]`` (default 0), then name the process and attempt."""
    time.sleep(float(payload.get("seconds", 0)))
    return {"attempt": job.attempts, "pid": os.getpid()}


def report_progress(payload: dict[str, Any], job: Job) -> str:
    """Report 0.25 "first", then a tight loop of ``payload["calls"]`` reports ending at
    0.5 "second"; then wait up to ``payload["wait"]`` seconds to be cancelled."""
    job.progress(0.25, "first")
    time.sleep(float(payload.get("pause", 1.5)))
    calls = int(payload.get("calls", 1))
    for call in range(calls):
        job.progress(0.25 + 0.25 * (call + 1) / calls, "second" if call == calls - 1 else "loop")
    job.wait_cancelled(float(payload.get("wait", 0)))
    return "done"


@hookimpl
def register_tasks(register: Callable[..., None]) -> None:
    register("stall_first", stall_first)
    register("whoami", whoami)
    register("report_progress", report_progress)


@hookimpl
def on_start(job: Job) -> None:
    _record("on_start", job)


@hookimpl
def on_success(job: Job, result: Any) -> None:
    _record("on_success", job, result=result)


@hookimpl
def on_fail(job: Job, error: str, next_run_at: datetime | None) -> None:
    _record("on_fail", job, error=error, next_run_at=next_run_at)


@hookimpl
def on_dead(job: Job) -> None:
    _record("on_dead", job)
