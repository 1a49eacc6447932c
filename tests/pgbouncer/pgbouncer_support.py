"""A private PgBouncer in transaction pooling mode in front of the test database.

It listens on a free loopback port with a configuration file written to a temporary
directory, and pools at most :data:`POOL_SIZE` server connections, so every client
shares them: a session-level feature (a prepared statement, a session advisory lock,
LISTEN) set up on one server connection is gone, or someone else's, on the next
transaction.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict

PGBOUNCER = "pgbouncer"
MISSING_REASON = (
    "pgbouncer is not installed: the PgBouncer tests need the Debian package "
    "(apt-get install -y pgbouncer)"
)
POOL_SIZE = 3
# PgBouncer refuses to run as root; it then runs as this user, or as the owner of the
# server's socket directory when it must reach the server through a Unix socket.
UNPRIVILEGED_USER = "nobody"


def pgbouncer_binary() -> str | None:
    """The pgbouncer program, if installed (Debian puts it in /usr/sbin)."""
    return shutil.which(PGBOUNCER) or shutil.which(PGBOUNCER, path="/usr/sbin:/usr/local/sbin")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass(frozen=True)
class Bouncer:
    """A running PgBouncer: the URL clients use, and its admin console."""

    url: str
    admin_url: str
    log_path: Path

    def pools(self) -> list[dict[str, object]]:
        """``SHOW POOLS`` of the admin console (which speaks the simple query protocol
        only: hence the client-side cursor)."""
        with psycopg.connect(
            self.admin_url, autocommit=True, cursor_factory=psycopg.ClientCursor
        ) as conn:
            cur = conn.execute("SHOW POOLS")
            names = [column.name for column in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def log(self) -> str:
        """PgBouncer's log so far, for failure messages."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def _run_as(server: dict[str, str]) -> str | None:
    if os.geteuid() != 0:
        return None
    host = server.get("host", "")
    if host.startswith("/"):
        return pwd.getpwuid(os.stat(host).st_uid).pw_name
    return UNPRIVILEGED_USER


@contextlib.contextmanager
def running_pgbouncer(database_url: str, binary: str) -> Iterator[Bouncer]:
    """PgBouncer in transaction mode in front of ``database_url``'s database."""
    server = conninfo_to_dict(database_url)
    dbname = server["dbname"]
    user = server.get("user") or "postgres"
    port = _free_port()
    directory = Path(tempfile.mkdtemp(prefix="pgqueue-pgbouncer-"))
    run_as = _run_as(server)
    target = " ".join(f"{key}={server[key]}" for key in ("host", "port") if server.get(key))
    config = directory / "pgbouncer.ini"
    log_path = directory / "pgbouncer.log"
    config.write_text(
        "\n".join(
            [
                "[databases]",
                f"{dbname} = {target} dbname={dbname} user={user}",
                "[pgbouncer]",
                "listen_addr = 127.0.0.1",
                f"listen_port = {port}",
                "unix_socket_dir =",
                "auth_type = any",
                "pool_mode = transaction",
                f"default_pool_size = {POOL_SIZE}",
                "max_client_conn = 500",
                f"admin_users = {user}",
                f"logfile = {log_path}",
                f"pidfile = {directory / 'pgbouncer.pid'}",
                "",
            ]
        )
    )
    if run_as is not None:
        entry = pwd.getpwnam(run_as)
        for path in (directory, config):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    command = [binary, *(["-u", run_as] if run_as else []), str(config)]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"postgresql://{user}@127.0.0.1:{port}/{dbname}"
    bouncer = Bouncer(
        url=url, admin_url=f"postgresql://{user}@127.0.0.1:{port}/pgbouncer", log_path=log_path
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(url, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not start:\n{bouncer.log()}") from None
                time.sleep(0.05)
        yield bouncer
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(directory, ignore_errors=True)
