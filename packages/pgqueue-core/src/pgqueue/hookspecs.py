"""The hooks pgqueue plugins implement.

Plugins are modules or objects with functions marked ``@pgqueue.hookimpl`` and named
after these specs, registered through the ``pgqueue`` entry-point group. A plugin
implements only the hooks it needs, and may accept only some of their arguments.

Lifecycle hooks (``on_*``) are notifications: they run after the state change has
committed, in the process that made it (a worker, the reaper, the API). They return
nothing, and one that raises is logged and counted and changes nothing.

They run on more than one thread: in a worker, ``on_start`` on the thread that claims,
``on_success``, ``on_fail`` and ``on_dead`` on the thread that writes outcomes, and the
reaper's on its own; in the API, on the request's. An implementation that keeps state
must guard it with a lock.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import pluggy

from pgqueue.job import Job

hookspec = pluggy.HookspecMarker("pgqueue")
hookimpl = pluggy.HookimplMarker("pgqueue")


@hookspec
def register_tasks(register: Callable[..., None]) -> None:
    """Register task handlers.

    Call ``register(name, handler, timeout_seconds=None)`` once per task. ``handler``
    is called with the job's payload (a dict), and also with ``job=`` (the
    :class:`~pgqueue.Job`, for its id and attempt number) if it declares a ``job``
    parameter. It returns a JSON-serialisable result; an ``async def`` handler is
    awaited on the worker's event loop. ``timeout_seconds``
    is the task's default per-attempt limit, used when a job carries none.
    """


@hookspec
def on_start(job: Job) -> None:
    """A job was claimed and is about to run (``job.attempts`` is this attempt's number)."""


@hookspec
def on_success(job: Job, result: Any) -> None:
    """A job's attempt succeeded and was acknowledged; ``result`` is what was stored."""


@hookspec
def on_fail(job: Job, error: str, next_run_at: datetime | None) -> None:
    """An attempt failed: the handler raised, timed out or returned a result that could
    not be stored, or the worker's lease expired and the reaper took the job back.

    Called once per failed attempt. ``next_run_at`` is when the job runs again, or
    None when this was the last attempt (``on_dead`` follows).
    """


@hookspec
def on_dead(job: Job) -> None:
    """A job used up its attempts and was dead-lettered. Called exactly once per death,
    by the worker or the reaper that made it."""


@hookspec
def on_cancel(job: Job) -> None:
    """A queued or running job was cancelled. A running attempt's outcome is discarded."""


@hookspec
def on_retry(job: Job) -> None:
    """A dead or cancelled job was put back to queued by ``retry``, attempts reset."""
