"""The console scripts of pgqueue's distributions, and a check that ``import pgqueue``
finds pgqueue-core's package.

``pgqueue`` is also the import name of an unrelated PyPI project called ``pgqueue`` (a
PgQ framework, last released in 2016, a single module ``pgqueue.py``), and a script of
one's own named ``pgqueue.py`` takes the name just as well. When Python finds such a
module before pgqueue-core's package (earlier on ``PYTHONPATH``, in the current
directory, or in site-packages while pgqueue-core is installed editable), everything
would fail obscurely: ``'pgqueue' is not a package``, ``No module named 'psycopg2'``,
or a ``Queue`` that is not ours. Instead:

- the ``pgqueue`` and ``pgqueue-api`` commands start here, outside the ``pgqueue``
  package, and exit with one line naming the module that is in the way;
- ``pgqueue-core.pth`` (installed into site-packages with pgqueue-core) calls
  :func:`install_import_check` when Python starts, so that ``import pgqueue`` raises an
  :class:`ImportError` saying the same instead of importing the other module.

pgqueue-core's package is the ``pgqueue`` folder beside this file: both are installed
(or, editable, live) in the same directory.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

MODULE = "pgqueue"
DISTRIBUTION = "pgqueue-core"
_OURS = os.path.join(os.path.dirname(os.path.abspath(__file__)), MODULE, "__init__.py")
# Files that only pgqueue-core's package has: another copy of it (a checkout on
# PYTHONPATH, say) is not foreign.
_FINGERPRINT = ("hookspecs.py", "plugins.py", "queue.py")


class ForeignPgqueue(ImportError):
    """``import pgqueue`` would load a module that is not pgqueue-core's package."""


def foreign_pgqueue() -> str | None:
    """One line naming the module ``import pgqueue`` loads (or has loaded) when it is
    not pgqueue-core's package, or None when it is (or when there is none at all)."""
    loaded = sys.modules.get(MODULE)
    spec = loaded.__spec__ if isinstance(loaded, ModuleType) else _find_spec()
    if spec is None or _is_ours(spec):
        return None
    where = spec.origin or spec.name
    folder = os.path.dirname(where) if spec.has_location else where
    owner = _owner(where)
    if owner is None:
        what = "which is not pgqueue-core's package (no installed distribution holds it)"
        fix = "rename or remove it"
    else:
        name, version = owner
        what = f"from {name} {version}, a project unrelated to pgqueue-core that shares the name"
        fix = f"pip uninstall {name}"
    return f"`import {MODULE}` finds {where}, {what}: {fix}, or take {folder} off the path"


def _find_spec() -> ModuleSpec | None:
    """The spec the import system would use for ``pgqueue``, asking every finder but
    the import check itself, and importing nothing."""
    for finder in sys.meta_path:
        if isinstance(finder, _ImportCheck) or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(MODULE, None)
        if spec is not None:
            return spec
    return None


def _is_ours(spec: ModuleSpec) -> bool:
    origin = spec.origin if spec.has_location else None
    if origin and os.path.realpath(origin) == os.path.realpath(_OURS):
        return True
    folders: Sequence[str] = spec.submodule_search_locations or ()
    return any(
        all(os.path.isfile(os.path.join(folder, name)) for name in _FINGERPRINT)
        for folder in folders
    )


def _owner(path: str) -> tuple[str, str] | None:
    """The installed distribution (name, version) that holds ``path``, if any."""
    from importlib import metadata

    target = os.path.realpath(path)
    for name in metadata.packages_distributions().get(MODULE, []):
        if name == DISTRIBUTION:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for file in dist.files or ():
            if os.path.realpath(str(dist.locate_file(file))) == target:
                return dist.metadata["Name"], dist.version
    return None


class _ImportCheck:
    """A meta path finder that refuses to import a foreign ``pgqueue``, naming it."""

    @staticmethod
    def find_spec(
        name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name != MODULE:
            return None
        problem = foreign_pgqueue()
        if problem is not None:
            raise ForeignPgqueue(problem, name=MODULE)
        # The import system asks the other finders next, and they find pgqueue-core's.
        return None


def install_import_check() -> None:
    """Make ``import pgqueue`` raise :class:`ForeignPgqueue` rather than load a module
    that is not pgqueue-core's package. Called once per interpreter by
    ``pgqueue-core.pth``; it costs nothing until ``pgqueue`` is imported."""
    if not any(isinstance(finder, _ImportCheck) for finder in sys.meta_path):
        sys.meta_path.insert(0, _ImportCheck())


def _launch(module: str, function: str = "main") -> None:
    problem = foreign_pgqueue()
    if problem is not None:
        # One line, no traceback, the status of any other error that stops a command.
        print(f"Error: {problem}", file=sys.stderr)
        sys.exit(1)
    getattr(importlib.import_module(module), function)()


def pgqueue() -> None:
    """The ``pgqueue`` command."""
    _launch("pgqueue.cli")


def pgqueue_api() -> None:
    """The ``pgqueue-api`` command (pgqueue-api's distribution points here)."""
    _launch("pgqueue_api.cli")
