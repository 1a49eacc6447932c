"""The plugin manager: hookspecs, built-in plugins, and plugins found through entry points."""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import logging
import os
import threading
import traceback
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from importlib import metadata
from typing import Any, cast

import pluggy
from pluggy import HookImpl

from pgqueue import hookspecs, lifecycle_log
from pgqueue.errors import PgQueueError, ValidationError
from pgqueue.job import Job

log = logging.getLogger("pgqueue.plugins")

PROJECT = "pgqueue"
ENTRY_POINT_GROUP = "pgqueue"
BUILTIN_PLUGINS = {"pgqueue.lifecycle_log": lifecycle_log}


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


@dataclass(frozen=True)
class BrokenPlugin:
    """A plugin installed under the ``pgqueue`` entry-point group that failed to load:
    its module raised on import, or it implements a hook pgqueue does not have."""

    name: str
    version: str | None
    """Its distribution's version."""
    distribution: str | None
    """The distribution that declares it."""
    entry_point: str
    """The entry point as its distribution declares it: ``name = module:attr``."""
    error: str
    """The exception, on one line, and where it was raised."""

    def __str__(self) -> str:
        source = f" of {self.distribution} {self.version}" if self.distribution else ""
        return (
            f"plugin {self.name!r} (entry point {self.entry_point}{source}) "
            f"failed to load: {self.error}"
        )


class PluginLoadError(PgQueueError):
    """An installed plugin failed to load; ``broken`` says which, and why."""

    def __init__(self, broken: BrokenPlugin) -> None:
        super().__init__(str(broken))
        self.broken = broken


def get_plugin_manager(
    *, load_entrypoints: bool = True, broken: list[BrokenPlugin] | None = None
) -> pluggy.PluginManager:
    """A plugin manager with pgqueue's hookspecs, its built-in plugins and, unless told
    otherwise, every plugin installed under the ``pgqueue`` entry-point group.

    An installed plugin that fails to load (it raises on import, or implements a hook
    that does not exist, a misspelled name) raises :class:`PluginLoadError`; given a
    ``broken`` list, it is appended to it instead and the other plugins load.
    """
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
    for name, plugin in BUILTIN_PLUGINS.items():
        pm.register(plugin, name=name)
    if load_entrypoints:
        for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                # One entry point at a time, so that one broken plugin does not stop the
                # others; pluggy still records each one's distribution.
                pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=entry_point.name)
                check_hooks(pm, entry_point.name)
            except Exception as exc:
                if pm.has_plugin(entry_point.name):
                    pm.unregister(name=entry_point.name)
                failure = _broken(entry_point, exc)
                if broken is None:
                    raise PluginLoadError(failure) from exc
                log.debug("%s", failure, exc_info=True)
                broken.append(failure)
    pm.check_pending()
    return pm


def check_hooks(pm: pluggy.PluginManager, name: str) -> None:
    """Raise :class:`pluggy.PluginValidationError` if the plugin registered as ``name``
    implements a hook pgqueue does not have (pluggy would find it only later, in
    ``check_pending``, without saying which plugin it was)."""
    plugin = pm.get_plugin(name)
    for caller in pm.get_hookcallers(plugin) or []:
        if caller.has_spec():
            continue
        for impl in caller.get_hookimpls():
            if impl.plugin is plugin and not impl.optionalhook:
                raise pluggy.PluginValidationError(
                    plugin,
                    f"{name}: unknown hook {caller.name!r}; "
                    f"pgqueue's hooks are {', '.join(hook_names())}",
                )


def hook_names() -> list[str]:
    """The names of pgqueue's hooks."""
    return sorted(
        name
        for name, value in vars(hookspecs).items()
        if callable(value) and hasattr(value, f"{PROJECT}_spec")
    )


def plugin_error(exc: pluggy.PluginValidationError) -> str:
    """A plugin validation error on one line (pluggy's span several)."""
    return " ".join(str(exc).split())


def _broken(entry_point: metadata.EntryPoint, exc: Exception) -> BrokenPlugin:
    dist = entry_point.dist
    error = (
        plugin_error(exc)
        if isinstance(exc, pluggy.PluginValidationError)
        else f"{type(exc).__name__}: {' '.join(str(exc).split())}{_raised_at(exc)}"
    )
    return BrokenPlugin(
        name=entry_point.name,
        version=dist.version if dist is not None else None,
        distribution=dist.name if dist is not None else None,
        entry_point=f"{entry_point.name} = {entry_point.value}",
        error=error,
    )


def _raised_at(exc: BaseException) -> str:
    """`` (file.py, line N)``: the last frame of the traceback outside the import
    machinery, where the plugin's own code raised."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" ({exc.filename}, line {exc.lineno})"
    machinery = (os.path.dirname(importlib.__file__), os.path.dirname(pluggy.__file__))
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith(("<frozen", *machinery))
    ]
    if not frames:
        return ""
    return f" ({frames[-1].filename}, line {frames[-1].lineno})"


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


@dataclass(frozen=True)
class _HookPlan:
    """What calling one hook takes, worked out once per set of implementations: their
    stand-ins (see :meth:`LifecycleHooks._isolated`), each with its
    :func:`pgqueue.call_when` predicate (None: always called). A worker calls
    ``on_start`` for every job, mostly with no implementation that wants it, so this is
    kept to a plain loop."""

    impls: list[HookImpl]
    isolated: list[HookImpl]
    conditions: tuple[tuple[HookImpl, Callable[[], object] | None], ...]
    """Each stand-in with its predicate, in pluggy's order; empty when no implementation
    has one, and every call takes them all."""

    def called_now(self) -> list[HookImpl]:
        """The stand-ins of the implementations to call now. A predicate that raises
        counts as yes: the implementation runs, and its own isolation deals with what
        is wrong."""
        if not self.conditions:
            return self.isolated
        called = []
        for stand_in, predicate in self.conditions:
            if predicate is not None:
                try:
                    if not predicate():
                        continue
                except Exception:
                    pass
            called.append(stand_in)
        return called


class LifecycleHooks:
    """Calls lifecycle hooks so that one plugin's failure never reaches another plugin,
    the caller, or the job: an exception from any implementation is logged, counted in
    ``errors``, and the call goes on without it.

    Calls go through pluggy as ``pm.hook.<name>(**kwargs)`` would: the same
    implementations in the same order, wrappers (``wrapper=True`` and old-style
    ``hookwrapper=True``) around them, and ``pm.add_hookcall_monitoring`` tracers see
    every call. A plain pluggy call stops at the first implementation that raises; so
    each implementation is run through a stand-in that catches its exceptions (see
    :meth:`_isolated`), and pluggy runs the stand-ins.
    """

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self.pm = pm
        self.errors: Counter[str] = Counter()
        self._errors_lock = threading.Lock()
        # Per hook: the plan for the implementations last seen. Rebuilt when a plugin
        # is registered or unregistered; a race only builds it twice.
        self._plans: dict[str, _HookPlan] = {}

    def call(self, hook_name: str, **kwargs: Any) -> None:
        """Run every implementation of ``hook_name`` with the arguments it asks for."""
        self.call_each(hook_name, (kwargs,))

    def call_each(self, hook_name: str, calls: Iterable[Mapping[str, Any]]) -> None:
        """``call(hook_name, **kwargs)`` for each of ``calls``, in order: a worker acks
        hundreds of jobs per statement, and looks up the implementations once for all
        of them. With no implementation, or none that wants to be called now (see
        :func:`pgqueue.call_when`), ``calls`` is not even iterated."""
        caller = getattr(self.pm.hook, hook_name)
        impls = caller.get_hookimpls()
        if not impls:
            return
        plan = self._plans.get(hook_name)
        if plan is None or plan.impls != impls:  # HookImpls compare by identity
            plan = self._plan(hook_name, impls)
        isolated = plan.called_now()
        if not isolated:
            return
        # The function HookCaller.__call__ runs: pluggy's multicall behind any
        # monitoring installed with add_hookcall_monitoring.
        execute = caller._hookexec
        for kwargs in calls:
            try:
                execute(hook_name, isolated, kwargs, False)
            except Exception:
                # Only what no stand-in can catch: a missing argument, a wrapper that
                # does not yield.
                self._failed(hook_name, None)

    def _plan(self, hook_name: str, impls: list[HookImpl]) -> _HookPlan:
        isolated = [self._isolated(hook_name, impl) for impl in impls]
        predicates = [getattr(impl.function, hookspecs.CALL_WHEN_ATTRIBUTE, None) for impl in impls]
        conditional = any(predicate is not None for predicate in predicates)
        plan = _HookPlan(
            impls=impls,
            isolated=isolated,
            conditions=tuple(zip(isolated, predicates, strict=True)) if conditional else (),
        )
        self._plans[hook_name] = plan
        return plan

    def _isolated(self, hook_name: str, impl: HookImpl) -> HookImpl:
        """A copy of ``impl`` (same plugin, options and argument names, so pluggy
        orders, calls and reports it as the original) whose function contains the
        original's exceptions."""
        stand_in = copy.copy(impl)
        function = impl.function
        if not (impl.wrapper or impl.hookwrapper):

            @functools.wraps(function)  # tracers see the original's name
            def call_isolated(*args: Any, **kwargs: Any) -> Any:
                try:
                    return function(*args, **kwargs)
                except Exception:
                    self._failed(hook_name, impl)
                    return None

            stand_in.function = call_isolated  # type: ignore[misc]
            return stand_in

        @functools.wraps(function)
        def wrap_isolated(*args: Any, **kwargs: Any) -> Generator[None, Any, Any]:
            # A wrapper is a generator: its code before the yield runs before the
            # implementations, its code after once they are done. Either part may
            # raise; then the wrapper is left out and the call goes on with the result
            # it was handed (for an old-style wrapper pluggy ignores what this returns).
            try:
                # pluggy types an implementation's result as object; a wrapper's is
                # the generator its function returns.
                teardown = cast(Generator[None, Any, Any], function(*args, **kwargs))
                next(teardown)
            except Exception:  # StopIteration too: a wrapper must yield once
                self._failed(hook_name, impl)
                return (yield)
            try:
                sent = yield
            except BaseException as exc:
                # Pluggy throws in what escaped the implementations; the stand-ins let
                # only BaseExceptions (KeyboardInterrupt, ...) escape. Hand it on.
                try:
                    teardown.throw(exc)
                except StopIteration as stop:
                    return stop.value
                teardown.close()
                raise
            try:
                teardown.send(sent)
            except StopIteration as stop:
                return stop.value if impl.wrapper else sent
            except Exception:
                self._failed(hook_name, impl)
                return sent
            teardown.close()
            self._failed(hook_name, impl, "yielded twice")
            return sent

        stand_in.function = wrap_isolated  # type: ignore[misc]
        return stand_in

    def _failed(self, hook_name: str, impl: HookImpl | None, problem: str = "raised") -> None:
        """Count and log the exception being handled (or ``problem``)."""
        with self._errors_lock:
            self.errors[hook_name] += 1
        where = f" of plugin {impl.plugin_name}" if impl is not None else ""
        log.error(
            "hook %s%s %s; ignored",
            hook_name,
            where,
            problem,
            exc_info=problem == "raised",
        )


@dataclass(frozen=True)
class PluginInfo:
    """What ``pgqueue plugins`` shows about one registered plugin."""

    name: str
    version: str | None
    tasks: list[str]
    hooks: list[str]


def describe_plugins(pm: pluggy.PluginManager) -> list[PluginInfo]:
    """Each registered plugin with its distribution version, tasks and hooks."""
    versions = {plugin_name: dist.version for plugin_name, dist in _entrypoint_dists(pm)}
    tasks = collect_tasks(pm)
    infos = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:
            continue
        hooks = sorted(caller.name for caller in pm.get_hookcallers(plugin) or [])
        infos.append(
            PluginInfo(
                name=name,
                version=versions.get(name),
                tasks=sorted(t.name for t in tasks.values() if t.source == name),
                hooks=hooks,
            )
        )
    return infos


def _entrypoint_dists(pm: pluggy.PluginManager) -> list[tuple[str, Any]]:
    found = []
    for plugin, dist in pm.list_plugin_distinfo():
        name = pm.get_name(plugin)
        if name is not None:  # plugins loaded from entry points are registered by name
            found.append((name, dist))
    return found
