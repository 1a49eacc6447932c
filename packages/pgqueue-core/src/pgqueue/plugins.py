"""The plugin manager: hookspecs, built-in plugins, and plugins found through entry points."""

from __future__ import annotations

import inspect
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pluggy

from pgqueue import hookspecs, lifecycle_log
from pgqueue.errors import PgQueueError

log = logging.getLogger("pgqueue.plugins")

PROJECT = "pgqueue"
ENTRY_POINT_GROUP = "pgqueue"
BUILTIN_PLUGINS = {"pgqueue.lifecycle_log": lifecycle_log}


class TaskConflict(PgQueueError):
    """Two plugins registered the same task name."""


@dataclass(frozen=True)
class TaskHandler:
    """A task name, the callable that runs it, and where it came from."""

    name: str
    function: Callable[..., Any]
    timeout_seconds: float | None = None
    source: str = "explicit"

    @property
    def is_async(self) -> bool:
        """True for ``async def`` handlers, which run on the worker's event loop."""
        return inspect.iscoroutinefunction(self.function)

    @property
    def wants_job(self) -> bool:
        """True when the handler declares a ``job`` parameter."""
        try:
            return "job" in inspect.signature(self.function).parameters
        except (TypeError, ValueError):
            return False


def get_plugin_manager(*, load_entrypoints: bool = True) -> pluggy.PluginManager:
    """A plugin manager with pgqueue's hookspecs, its built-in plugins and, unless told
    otherwise, every plugin installed under the ``pgqueue`` entry-point group.

    Raises if a plugin implements a hook that does not exist (a misspelled name).
    """
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
    for name, plugin in BUILTIN_PLUGINS.items():
        pm.register(plugin, name=name)
    if load_entrypoints:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    pm.check_pending()
    return pm


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


class LifecycleHooks:
    """Calls lifecycle hooks so that one plugin's failure never reaches another plugin,
    the caller, or the job: each implementation runs on its own, and an exception is
    logged and counted in ``errors``."""

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self.pm = pm
        self.errors: Counter[str] = Counter()

    def call(self, hook_name: str, **kwargs: Any) -> None:
        """Run every implementation of ``hook_name`` with the arguments it asks for."""
        self.call_each(hook_name, [kwargs])

    def call_each(self, hook_name: str, calls: Iterable[Mapping[str, Any]]) -> None:
        """``call(hook_name, **kwargs)`` for each of ``calls``, in order: a worker starts
        and acks hundreds of jobs per statement, and looks up the implementations once
        for all of them."""
        impls = list(reversed(getattr(self.pm.hook, hook_name).get_hookimpls()))
        if not impls:
            return
        for kwargs in calls:
            for impl in impls:
                try:
                    impl.function(**{name: kwargs[name] for name in impl.argnames})
                except Exception:
                    self.errors[hook_name] += 1
                    log.exception(
                        "hook %s of plugin %s raised; ignored", hook_name, impl.plugin_name
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
        found.append((pm.get_name(plugin), dist))
    return found
