"""Task handlers: a task's name, the function that runs it, and how it is called.

Plugins offer them through the ``register_tasks`` hook (see :func:`collect_tasks`); the
worker runs them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pluggy

from pgqueue.errors import PgQueueError, ValidationError
from pgqueue.job import Job


class TaskConflict(PgQueueError):
    """Two plugins registered the same task name."""


# The arguments a handler is called with, decided once from its signature (see
# TaskHandler): the payload, the Job, or the payload and ``job=``.
TAKES_PAYLOAD = "payload"
TAKES_JOB = "job"
TAKES_BOTH = "payload, job"

SUPPORTED_SIGNATURES = "def f(payload), def f(job) or def f(payload, job)"


@dataclass(frozen=True)
class TaskHandler:
    """A task name, the callable that runs it, and where it came from.

    The handler's signature decides what it is called with, once, here (a handler
    whose signature pgqueue cannot call raises :class:`~pgqueue.ValidationError` now,
    not on every attempt):

    - ``def f(payload)``: the job's payload (any parameter name but ``job``);
    - ``def f(job)``: the :class:`~pgqueue.Job`, when the only parameter is named
      ``job`` (its payload is ``job.payload``);
    - ``def f(payload, job)``: the payload, and the Job as ``job=`` (``job`` may also
      be keyword-only).

    Other parameters must have defaults. A callable whose signature cannot be read
    (some built-ins) is given the payload.
    """

    name: str
    function: Callable[..., Any]
    timeout_seconds: float | None = None
    source: str = "explicit"

    def __post_init__(self) -> None:
        self.takes  # noqa: B018  (a signature pgqueue cannot call fails here)

    @cached_property
    def takes(self) -> str:
        """What the handler is called with: ``"payload"``, ``"job"`` or ``"payload, job"``."""
        return _handler_takes(self)

    @property
    def is_async(self) -> bool:
        """True for ``async def`` handlers, which run on the worker's event loop."""
        return inspect.iscoroutinefunction(self.function)

    @property
    def wants_job(self) -> bool:
        """True when the handler is given the :class:`~pgqueue.Job`."""
        return self.takes != TAKES_PAYLOAD

    def call(self, job: Job) -> Any:
        """Call the handler for ``job``, with the arguments its signature asks for."""
        takes = self.takes
        if takes == TAKES_PAYLOAD:
            return self.function(job.payload)
        if takes == TAKES_JOB:
            return self.function(job)
        return self.function(job.payload, job=job)


def _handler_takes(handler: TaskHandler) -> str:
    """What ``handler`` is called with; raises ValidationError for a signature that
    cannot be called with the payload and the job alone."""
    try:
        signature = inspect.signature(handler.function)
    except (TypeError, ValueError):
        return TAKES_PAYLOAD
    parameters = list(signature.parameters.values())
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    first = positional[0] if positional else None
    varargs = any(p.kind is p.VAR_POSITIONAL for p in parameters)
    # The Job goes to a parameter named ``job``: the first (then it gets nothing else),
    # or any other one it can be passed to by keyword.
    job = next(
        (
            p
            for p in parameters
            if p.name == "job"
            and (p is first or p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        ),
        None,
    )

    def refuse(problem: str) -> ValidationError:
        where = "" if handler.source == "explicit" else f" of {handler.source}"
        return ValidationError(
            f"task {handler.name!r}{where}",
            f"handler {_describe(handler.function)}{signature} {problem}; "
            f"a handler is {SUPPORTED_SIGNATURES}",
        )

    if first is not None and first is job:
        takes = TAKES_JOB
    elif first is not None or varargs:
        takes = TAKES_BOTH if job is not None else TAKES_PAYLOAD
    else:
        raise refuse("has no parameter for the payload or the job")
    unsupplied = [
        repr(p.name)
        for p in parameters
        if p is not first
        and p is not job
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        and p.default is p.empty
    ]
    if unsupplied:
        raise refuse(f"has parameters pgqueue cannot supply: {', '.join(unsupplied)}")
    return takes


def _describe(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", None) or type(function).__name__


def collect_tasks(pm: pluggy.PluginManager) -> dict[str, TaskHandler]:
    """Every task handler the registered plugins offer through ``register_tasks``."""
    tasks: dict[str, TaskHandler] = {}
    for impl in pm.hook.register_tasks.get_hookimpls():
        source = impl.plugin_name

        def register(
            name: str,
            function: Callable[..., Any],
            timeout_seconds: float | None = None,
            *,
            _source: str = source,
        ) -> None:
            if name in tasks:
                raise TaskConflict(
                    f"task {name!r} is registered by both {tasks[name].source} and {_source}"
                )
            tasks[name] = TaskHandler(name, function, timeout_seconds, _source)

        impl.function(register=register)
    return tasks
