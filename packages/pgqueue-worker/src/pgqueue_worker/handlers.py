"""Where a worker's task handlers come from: plugins, and explicit ``module:ATTR`` dicts."""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pgqueue import TaskHandler, ValidationError, validation

log = logging.getLogger("pgqueue.worker")

HandlerLike = Callable[..., Any] | TaskHandler


def as_task_handlers(
    handlers: Mapping[str, HandlerLike], source: str = "explicit"
) -> dict[str, TaskHandler]:
    """``{task name: TaskHandler}`` from a mapping of names to callables or TaskHandlers.

    Raises ValidationError for a bad task name, and for a handler whose signature
    pgqueue cannot call (see :class:`~pgqueue.TaskHandler`)."""
    out: dict[str, TaskHandler] = {}
    for name, handler in handlers.items():
        validation.name("task", name)
        if isinstance(handler, TaskHandler):
            out[name] = handler
        elif callable(handler):
            out[name] = TaskHandler(name, handler, None, source)
        else:
            raise ValidationError("handlers", f"the handler of task {name!r} is not callable")
    return out


def merge_handlers(
    discovered: Mapping[str, TaskHandler], explicit: Mapping[str, TaskHandler]
) -> dict[str, TaskHandler]:
    """Plugin handlers plus explicit ones. An explicit handler wins a name clash, and
    the clash is logged, since one of the two will never run here."""
    merged = dict(discovered)
    for name, handler in explicit.items():
        if name in merged and merged[name].function is not handler.function:
            log.warning(
                "task %r from %s replaces the one registered by plugin %s",
                name,
                handler.source,
                merged[name].source,
            )
        merged[name] = handler
    return merged


def import_object(spec: str) -> Any:
    """The object named by ``module:attribute`` (the attribute may be dotted).

    The current directory is importable, as it is for ``python -m``, so that
    ``--handlers myapp.tasks:HANDLERS`` works from a project's root.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"{spec!r} is not of the form module:ATTRIBUTE")
    _make_cwd_importable()
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r}: {exc}") from None
    found: Any = module
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ValueError(f"module {module_name!r} has no attribute {attribute!r}") from None
    return found


def import_module(name: str) -> Any:
    """The module ``name``, with the current directory importable."""
    _make_cwd_importable()
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ValueError(f"cannot import {name!r}: {exc}") from None


def load_handlers(spec: str) -> dict[str, TaskHandler]:
    """The handlers of ``--handlers module:ATTR``: a dict of task name to callable."""
    found = import_object(spec)
    if not isinstance(found, Mapping):
        raise ValueError(f"{spec} is a {type(found).__name__}, not a dict of task name to callable")
    try:
        return as_task_handlers(found, source=spec)
    except ValidationError as exc:
        # A handler refused for its signature names its source, this spec, already.
        raise ValueError(str(exc) if spec in exc.field else f"{spec}: {exc}") from None


def _make_cwd_importable() -> None:
    cwd = str(Path.cwd())
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
