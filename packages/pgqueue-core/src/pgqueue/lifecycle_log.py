"""Built-in plugin: one structured log line per state change.

Each record carries ``job_id``, ``task``, ``queue``, ``attempt`` and, where it applies,
``duration`` as extra fields, so a JSON log formatter emits them as keys.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from pgqueue.hookspecs import call_when, hookimpl
from pgqueue.job import Job

log = logging.getLogger("pgqueue.jobs")


def _fields(job: Job) -> dict[str, Any]:
    duration = None
    if job.started_at is not None and job.finished_at is not None:
        duration = round((job.finished_at - job.started_at).total_seconds(), 6)
    return {
        "job_id": job.id,
        "task": job.task,
        "queue": job.queue,
        "attempt": job.attempts,
        "state": job.state.value,
        "duration": duration,
    }


def _logs_info() -> bool:
    """Whether lines at INFO are logged: a busy worker starts and acks thousands of jobs
    a second, and below that level skips the calls of the hooks that log at it."""
    return log.isEnabledFor(logging.INFO)


@hookimpl
@call_when(_logs_info)
def on_start(job: Job) -> None:
    """Log the start of an attempt."""
    log.info("job %s %s started (attempt %s)", job.id, job.task, job.attempts, extra=_fields(job))


@hookimpl
@call_when(_logs_info)
def on_success(job: Job) -> None:
    """Log a success with its duration."""
    fields = _fields(job)
    log.info(
        "job %s %s succeeded in %.3fs", job.id, job.task, fields["duration"] or 0.0, extra=fields
    )


@hookimpl
def on_fail(job: Job, error: str, next_run_at: datetime | None) -> None:
    """Log a failed attempt and when it runs again."""
    when = next_run_at.isoformat() if next_run_at else "never (dead)"
    log.warning(
        "job %s %s attempt %s failed: %s; next run %s",
        job.id,
        job.task,
        job.attempts,
        error,
        when,
        extra=_fields(job),
    )


@hookimpl
def on_dead(job: Job) -> None:
    """Log a dead-lettered job."""
    log.error(
        "job %s %s is dead after %s attempts", job.id, job.task, job.attempts, extra=_fields(job)
    )


@hookimpl
@call_when(_logs_info)
def on_cancel(job: Job) -> None:
    """Log a cancellation."""
    log.info("job %s %s cancelled", job.id, job.task, extra=_fields(job))


@hookimpl
@call_when(_logs_info)
def on_retry(job: Job) -> None:
    """Log a manual retry."""
    log.info(
        "job %s %s put back to %s by retry", job.id, job.task, job.state.value, extra=_fields(job)
    )
