"""The plugin manager: hookspecs, built-in plugins, and plugins found through entry points.

What the plugins offer lives beside it: task handlers in :mod:`pgqueue.task_handlers`,
the calling of lifecycle hooks in :mod:`pgqueue.lifecycle_hooks`.
"""

from __future__ import annotations

import importlib
import logging
import os
import traceback
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import pluggy

from pgqueue import hookspecs, lifecycle_log
from pgqueue.errors import PgQueueError
from pgqueue.task_handlers import collect_tasks

log = logging.getLogger("pgqueue.plugins")

PROJECT = "pgqueue"
ENTRY_POINT_GROUP = "pgqueue"
BUILTIN_PLUGINS = {"pgqueue.lifecycle_log": lifecycle_log}


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
