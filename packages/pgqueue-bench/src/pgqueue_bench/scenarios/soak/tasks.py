"""The soak's handlers and schedule, a plugin its workers load by name::

    pgqueue worker --plugin pgqueue_bench.scenarios.soak.tasks --no-plugin-autoload

``soak_work`` first leaves a line in a local invocation log (it survives the database
being down, and the audit trail is judged against it), then behaves as its payload
says: ``{"fail": true}`` raises on every attempt, so the job goes dead once its
attempts are spent; otherwise it sleeps ``ms`` milliseconds in ``job.wait_cancelled``,
so a job that is cancelled, loses its lease or overruns its ``timeout_seconds`` returns
early, as a well-behaved long handler should.

The schedule ``soak-tick`` enqueues one short job every five seconds into a queue of
its own: a periodic job that every worker's scheduler competes for, through every fault.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pgqueue import Job, hookimpl
from pgqueue_bench.verdict.deliveries import LazyInvocationLog

WORK_TASK = "soak_work"
SOAK_QUEUE = "soak"
LIMITED_QUEUE = "soak_limited"
SCHEDULE_QUEUE = "soak_schedule"
"""The schedule's own queue: its jobs are the only ones no producer enqueued."""
SCHEDULE_NAME = "soak-tick"
SCHEDULE_CRON = "*/5 * * * * *"
SCHEDULE_SECONDS = 5.0
RUN_DIR_VARIABLE = "PGQUEUE_SOAK_RUN_DIR"

_invocations = LazyInvocationLog(RUN_DIR_VARIABLE)


class InjectedFailure(Exception):
    """Raised on purpose for a job whose payload says ``fail``."""


def work(payload: dict[str, Any], job: Job) -> dict[str, Any]:
    """Record the invocation, then fail or work as the payload says."""
    _invocations.append(job.id, job.attempts, job.lease_token)
    if payload.get("fail"):
        raise InjectedFailure(f"attempt {job.attempts} of job {job.id} failed on purpose")
    if job.wait_cancelled(float(payload.get("ms", 10)) / 1000):
        return {"called_off": True}  # discarded by the worker: the attempt was called off
    return {"attempt": job.attempts}


@hookimpl
def register_tasks(register: Callable[..., None]) -> None:
    register(WORK_TASK, work)


@hookimpl
def register_schedules(register: Callable[..., None]) -> None:
    register(SCHEDULE_NAME, SCHEDULE_CRON, WORK_TASK, payload={"ms": 5}, queue=SCHEDULE_QUEUE)
