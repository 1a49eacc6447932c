"""The hooks pgqueue plugins implement.

Plugins are modules or objects with functions marked ``@pgqueue.hookimpl`` and named
after these specs, registered through the ``pgqueue`` entry-point group. A plugin
implements only the hooks it needs, and may accept only some of their arguments.

Lifecycle hooks (``on_*``) are notifications. They return nothing, and one that
raises is logged and counted and changes nothing: the other implementations still
run, and so does the job. They are called through pluggy, so ``wrapper=True`` (and
old-style ``hookwrapper=True``) implementations wrap them and
``PluginManager.add_hookcall_monitoring`` sees every call.

When each one runs, relative to the commit of the change it reports:

- ``on_start``: in the worker, on the thread that runs the handler, just before the
  handler is called: after the claim committed, and after the wait for a free slot of
  a job claimed ahead. An attempt called off before its handler started (cancelled,
  lease lost) gets none. ``WorkerProtocol.claim`` runs no hook.
- ``on_success``, ``on_fail``, ``on_dead``: after the statement that records the
  outcome committed, in the process that wrote it (the worker's outcome writer, or
  the reaper for an expired lease). So a job's ``on_success`` may come after later
  jobs' ``on_start``.
- ``on_cancel``, ``on_retry``: after the change committed, in the process that made it,
  not in a worker running the job. Hooks run only where a Queue was given them
  (``Queue(..., hooks=LifecycleHooks(pm))``, as ``pgqueue worker`` does): the HTTP API
  and the ``pgqueue cancel`` / ``retry`` commands load no plugins and run none.

A hook runs once the commit is done, never inside the transaction: if the process
dies in between, the hook does not run for that change (lifecycle hooks are at most
once; the jobs table is the record).

They run on more than one thread: in a worker, ``on_start`` on the handler's slot
thread (the event loop's thread for ``async def`` handlers: keep it quick), the
outcome hooks on the thread that writes outcomes (the claimer's, for a payload that
cannot be decoded), and the reaper's on its own. An implementation that keeps state
must guard it with a lock.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import pluggy

from pgqueue.job import Job

hookspec = pluggy.HookspecMarker("pgqueue")
hookimpl = pluggy.HookimplMarker("pgqueue")

_Implementation = TypeVar("_Implementation", bound=Callable[..., Any])
CALL_WHEN_ATTRIBUTE = "pgqueue_call_when"


def call_when(predicate: Callable[[], bool]) -> Callable[[_Implementation], _Implementation]:
    """Mark a lifecycle hook implementation (``on_*``) to be called only while
    ``predicate()`` is true, for one that has nothing to do most of the time (a log
    line below the configured level, say)::

        @pgqueue.hookimpl
        @pgqueue.call_when(lambda: log.isEnabledFor(logging.INFO))
        def on_start(job): ...

    A worker starts and acks thousands of jobs a second; with every implementation of
    a hook switched off this way it skips the call through pluggy altogether. The
    predicate is asked once per batch of calls (the acks of one statement, the start
    of one attempt), on the thread that makes them, so it must be cheap and safe to
    call from any thread. A plain ``pm.hook.on_start(...)`` ignores the mark.
    """

    def mark(function: _Implementation) -> _Implementation:
        setattr(function, CALL_WHEN_ATTRIBUTE, predicate)
        return function

    return mark


@hookspec
def register_tasks(register: Callable[..., None]) -> None:
    """Register task handlers.

    Call ``register(name, handler, timeout_seconds=None)`` once per task. The
    handler's signature says what it is given:

    - ``def handler(payload)``: the job's payload (a dict); any name but ``job``;
    - ``def handler(job)``: the :class:`~pgqueue.Job` (its payload is ``job.payload``),
      when its only parameter is named ``job``;
    - ``def handler(payload, job)``: both, the Job as ``job=`` (``job`` may be
      keyword-only).

    Further parameters need defaults. Any other signature is refused when it is
    registered, with an error naming the task (``pgqueue worker`` does not start).

    It returns a JSON-serialisable result; an ``async def`` handler is awaited on the
    worker's event loop. ``timeout_seconds`` is the task's default per-attempt limit,
    used when a job carries none.

    A plain-function handler cannot be interrupted: when the worker calls its attempt
    off (the job was cancelled, the lease was lost, the attempt timed out) it runs on,
    and its outcome is discarded. One that runs long takes ``job`` and checks
    ``job.cancelled`` (or sleeps with ``job.wait_cancelled(seconds)``) to return early.
    An ``async def`` handler is cancelled (``asyncio.CancelledError``).
    """


@hookspec
def register_schedules(register: Callable[..., None]) -> None:
    """Declare periodic jobs.

    Call ``register(name, cron, task, payload=None, queue="default", priority=0,
    timezone="UTC", max_attempts=None)`` once per schedule: every tick of ``cron`` in
    ``timezone`` enqueues one job of ``task`` with ``payload`` into ``queue``, however
    many workers run. ``cron`` is a 5-field expression (``30 2 * * *``), or 6 fields
    with a leading seconds field (``*/10 * * * * *``); ``timezone`` is an IANA name
    (``Europe/Berlin``). ``max_attempts`` None gives the jobs the default.

    Names are unique across every plugin. A declaration that cannot work (an invalid
    expression, an unknown time zone, a name declared twice) raises
    :class:`~pgqueue.schedules.ScheduleError`, and ``pgqueue worker`` does not start.
    Each worker writes its plugins' schedules to the database when it starts; see
    :mod:`pgqueue.schedules` for ticks across daylight saving time and
    :mod:`pgqueue.schedule_store` for what a changed or removed declaration does.
    """


@hookspec
def on_start(job: Job) -> None:
    """A job's handler is about to be called (``job.attempts`` is this attempt's
    number). Runs on the handler's thread, after the claim committed, and counts
    against the attempt's time limit; see the module's documentation."""


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
    """A queued or running job was cancelled. A running attempt's outcome is discarded,
    and its worker calls it off (``job.cancelled``) when its heartbeat learns of it."""


@hookspec
def on_retry(job: Job) -> None:
    """A dead or cancelled job was put back to queued by ``retry``, attempts reset (or
    to waiting, for a job whose dependencies have not all succeeded)."""
