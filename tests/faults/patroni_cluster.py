"""A Patroni cluster of its own: one etcd member and two PostgreSQL nodes managed by
Patroni (a primary and a synchronous replica), all on loopback ports in a temporary
directory.

Patroni, not the test, decides which node is the primary: it promotes and demotes,
rewinds and restarts PostgreSQL, as it would in production. The test only asks it for a
switchover or a failover (``patronictl``), or kills the primary's postmaster, and
watches. PostgreSQL refuses to run as root, so as root Patroni (which runs PostgreSQL
itself) runs as the binaries' server user, through ``runuser``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from polling import wait_for

from pgqueue_bench.infra.binaries import Binaries
from pgqueue_bench.infra.servers import LOOPBACK, SUPERUSER, free_port

PROGRAMS = ("etcd", "patroni", "patronictl")

# Patroni's timing: the leader key lives TTL seconds unless renewed, and each node
# checks the cluster every LOOP_WAIT seconds. Short, so that an event plays out in
# seconds rather than the production defaults' half minute.
TTL = 10
LOOP_WAIT = 1
RETRY_TIMEOUT = 3


class PatroniUnavailable(RuntimeError):
    """Patroni or etcd is not installed, or would not start here."""


def missing_programs() -> list[str]:
    """The programs of :data:`PROGRAMS` this machine lacks."""
    return [name for name in PROGRAMS if shutil.which(name) is None]


@dataclass
class Node:
    """One Patroni member: its PostgreSQL port, its REST API port, its files."""

    name: str
    pg_port: int
    rest_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def config_path(self) -> Path:
        return self.directory / "patroni.yml"

    @property
    def log_path(self) -> Path:
        return self.directory / "patroni.log"

    def url(self, dbname: str = "postgres") -> str:
        """A direct connection to this node's PostgreSQL."""
        return f"postgresql://{SUPERUSER}@{LOOPBACK}:{self.pg_port}/{dbname}"

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid (first line of ``postmaster.pid``), if any."""
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def is_primary(self) -> bool:
        """True if this node's PostgreSQL accepts connections and is not in recovery."""
        try:
            with psycopg.connect(self.url(), connect_timeout=1, autocommit=True) as conn:
                return not conn.execute("select pg_is_in_recovery()").fetchone()[0]
        except psycopg.Error:
            return False


@dataclass
class PrimaryWatch:
    """Polls every node's ``pg_is_in_recovery()`` from a thread of its own, to tell how
    long the cluster went without a writable primary (wall clock, which is the database
    clock here: every server runs on this machine)."""

    nodes: list[Node]
    interval: float = 0.05
    samples: list[tuple[float, str | None]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> PrimaryWatch:
        self._thread = threading.Thread(target=self._run, name="primary-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            primary = next((node.name for node in self.nodes if node.is_primary()), None)
            self.samples.append((time.time(), primary))
            self._stop.wait(self.interval)

    @staticmethod
    def now() -> float:
        """The clock the samples are taken on."""
        return time.time()

    def back_at(self, since: float) -> float | None:
        """When, after ``since``, a primary was first seen that follows a sample without
        one or with another one: the primary back after the event, or None if nothing
        changed."""
        previous = None
        for at, primary in self.samples:
            if (
                at >= since
                and previous is not None
                and primary is not None
                and primary != previous[1]
            ):
                return at
            previous = (at, primary)
        return None

    def outage_after(self, since: float) -> tuple[float, float | None, float | None]:
        """(seconds, start, end) of the longest run of samples without a primary after
        ``since``: (0, None, None) if every sample saw one. An outage still going on at
        the last sample ends there."""
        best = (0.0, None, None)
        start = None
        for at, primary in self.samples:
            if at < since:
                continue
            if primary is None and start is None:
                start = at
            elif primary is not None and start is not None:
                if at - start > best[0]:
                    best = (at - start, start, at)
                start = None
        if start is not None and self.samples and self.samples[-1][0] - start > best[0]:
            best = (self.samples[-1][0] - start, start, None)
        return best

    def primaries_after(self, since: float) -> list[str]:
        """The nodes seen as primary after ``since``, in order, repeats collapsed."""
        seen: list[str] = []
        for at, primary in self.samples:
            if at >= since and primary is not None and (not seen or seen[-1] != primary):
                seen.append(primary)
        return seen


class PatroniCluster:
    """etcd plus two Patroni nodes with ``synchronous_mode: true``, in a temporary
    directory; :meth:`start` returns once there is a primary and a synchronous replica
    streaming from it, :meth:`destroy` stops everything and removes the directory."""

    def __init__(self, binaries: Binaries, *, scope: str = "pgqueue") -> None:
        self.binaries = binaries
        self.scope = scope
        self.directory = Path(tempfile.mkdtemp(prefix="pgq-patroni-"))
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.etcd: subprocess.Popen[bytes] | None = None
        self.nodes = [
            Node(f"node{n}", free_port(), free_port(), self.directory / f"node{n}") for n in (1, 2)
        ]

    # -- addresses ------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The one multi-host URL clients use: whichever node accepts writes."""
        hosts = ",".join(f"{LOOPBACK}:{node.pg_port}" for node in self.nodes)
        return f"postgresql://{SUPERUSER}@{hosts}/postgres?target_session_attrs=read-write"

    def node(self, name: str) -> Node:
        return next(node for node in self.nodes if node.name == name)

    # -- life cycle -----------------------------------------------------------------

    def start(self, timeout: float = 120) -> PatroniCluster:
        """Start etcd, then the first node (it bootstraps the cluster with initdb),
        then the second (a replica by ``pg_basebackup``); wait until it is synchronous."""
        missing = missing_programs()
        if missing:
            raise PatroniUnavailable(f"not installed: {', '.join(missing)}")
        self._give_to_server_user(self.directory)
        self._start_etcd()
        for node in self.nodes:
            node.directory.mkdir()
            self._give_to_server_user(node.directory)
            node.config_path.write_text(json.dumps(self._config(node), indent=2))
            self._give_to_server_user(node.config_path)
        self._start_node(self.nodes[0])
        wait_for(
            lambda: self._check_running() and self.leader() == self.nodes[0].name,
            timeout,
            what="the first Patroni node to bootstrap a primary",
        )
        self._start_node(self.nodes[1])
        self.wait_healthy(timeout)
        return self

    def _start_etcd(self) -> None:
        peer = f"http://{LOOPBACK}:{self.etcd_peer_port}"
        client = f"http://{LOOPBACK}:{self.etcd_port}"
        log = (self.directory / "etcd.log").open("ab")
        self.etcd = subprocess.Popen(
            [
                "etcd",
                "--name=etcd1",
                f"--data-dir={self.directory / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=etcd1={peer}",
                f"--initial-cluster-token={self.scope}",
                "--log-level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def healthy() -> bool:
            if self.etcd.poll() is not None:
                raise PatroniUnavailable(f"etcd exited {self.etcd.returncode}:\n{self.log_tails()}")
            with urllib.request.urlopen(f"{client}/health", timeout=1) as response:
                return json.loads(response.read()).get("health") == "true"

        wait_for(healthy, 60, what="etcd to answer", ignoring=(OSError,))

    def _config(self, node: Node) -> dict[str, Any]:
        """Patroni's configuration of ``node`` (YAML is a superset of JSON)."""
        trust = [
            f"host all all {LOOPBACK}/32 trust",
            f"host replication all {LOOPBACK}/32 trust",
            "local all all trust",
        ]
        return {
            "scope": self.scope,
            "name": node.name,
            "log": {"level": "INFO"},
            "restapi": {
                "listen": f"{LOOPBACK}:{node.rest_port}",
                "connect_address": f"{LOOPBACK}:{node.rest_port}",
            },
            "etcd3": {"hosts": [f"{LOOPBACK}:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL,
                    "loop_wait": LOOP_WAIT,
                    "retry_timeout": RETRY_TIMEOUT,
                    "synchronous_mode": True,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "parameters": {
                            "wal_log_hints": "on",
                            "max_connections": 200,
                            "shared_buffers": "64MB",
                            "logging_collector": "off",
                            "log_min_messages": "warning",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}, {"auth": "trust"}],
                "pg_hba": trust,
            },
            "postgresql": {
                "listen": f"{LOOPBACK}:{node.pg_port}",
                "connect_address": f"{LOOPBACK}:{node.pg_port}",
                "data_dir": str(node.data_dir),
                "bin_dir": str(self.binaries.bin_dir),
                "pgpass": str(node.directory / "pgpass"),
                "authentication": {
                    "superuser": {"username": SUPERUSER},
                    "replication": {"username": "replicator", "password": "replicator"},
                    "rewind": {"username": SUPERUSER},
                },
                "parameters": {"unix_socket_directories": str(node.directory)},
                "pg_hba": trust,
            },
        }

    def _give_to_server_user(self, path: Path) -> None:
        if self.binaries.os_user is None:
            return
        entry = pwd.getpwnam(self.binaries.os_user)
        os.chown(path, entry.pw_uid, entry.pw_gid)

    def _start_node(self, node: Node) -> None:
        prefix = ["runuser", "-u", self.binaries.os_user, "--"] if self.binaries.os_user else []
        log = node.log_path.open("ab")
        node.process = subprocess.Popen(
            [*prefix, "patroni", str(node.config_path)],
            cwd=node.directory,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "LC_ALL": "C.UTF-8", "PGTZ": "UTC"},
        )

    def _check_running(self) -> bool:
        for node in self.nodes:
            if node.process is not None and node.process.poll() is not None:
                raise PatroniUnavailable(
                    f"patroni {node.name} exited {node.process.returncode}:\n{self.log_tails()}"
                )
        return True

    def destroy(self) -> None:
        """Stop every Patroni (each stops its PostgreSQL) and etcd; remove the files."""
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                os.killpg(node.process.pid, signal.SIGTERM)
        for node in self.nodes:
            if node.process is None:
                continue
            try:
                node.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(node.process.pid, signal.SIGKILL)
                node.process.wait(10)
            # A postmaster Patroni left behind (killed before it could stop it).
            pid = node.postmaster_pid()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.terminate()
            try:
                self.etcd.wait(10)
            except subprocess.TimeoutExpired:
                self.etcd.kill()
                self.etcd.wait(10)
        shutil.rmtree(self.directory, ignore_errors=True)

    # -- Patroni's view -------------------------------------------------------------

    def members(self) -> list[dict[str, Any]]:
        """``GET /cluster`` from the first node's REST API that answers."""
        for node in self.nodes:
            try:
                url = f"http://{LOOPBACK}:{node.rest_port}/cluster"
                with urllib.request.urlopen(url, timeout=2) as response:
                    return json.loads(response.read())["members"]
            except (OSError, ValueError, KeyError):
                continue
        return []

    def leader(self) -> str | None:
        """The member Patroni reports as leader and running, if any."""
        return next(
            (
                member["name"]
                for member in self.members()
                if member["role"] == "leader" and member["state"] == "running"
            ),
            None,
        )

    def sync_standby(self) -> str | None:
        """The member Patroni reports as synchronous replica and streaming, if any."""
        return next(
            (
                member["name"]
                for member in self.members()
                if member["role"] == "sync_standby" and member["state"] in ("running", "streaming")
            ),
            None,
        )

    def wait_healthy(self, timeout: float = 120) -> tuple[str, str]:
        """Wait for a running leader and a streaming synchronous replica whose
        PostgreSQL agrees (the primary accepts writes); return (primary, replica)."""

        def healthy() -> tuple[str, str] | None:
            self._check_running()
            leader, replica = self.leader(), self.sync_standby()
            if leader is None or replica is None or not self.node(leader).is_primary():
                return None
            return leader, replica

        try:
            return wait_for(healthy, timeout, what="a primary and a synchronous replica")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.members()}\n{self.log_tails()}") from None

    # -- events -----------------------------------------------------------------------

    def patronictl(self, *args: str) -> str:
        """Run ``patronictl`` on this cluster; return its output, fail if it fails."""
        result = subprocess.run(
            ["patronictl", "-c", str(self.nodes[0].config_path), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, f"patronictl {args}: {result.stdout}{result.stderr}"
        return result.stdout

    def switchover(self, candidate: str) -> str:
        """``patronictl switchover --force`` to ``candidate``."""
        return self.patronictl("switchover", "--candidate", candidate, "--force")

    def failover(self, candidate: str) -> str:
        """``patronictl failover --force`` to ``candidate`` (Patroni 3.0 wants one)."""
        return self.patronictl("failover", "--candidate", candidate, "--force")

    def kill_postmaster(self, name: str) -> int:
        """SIGKILL the postmaster of node ``name``; its Patroni lives on. Return the pid."""
        pid = self.node(name).postmaster_pid()
        assert pid is not None, f"{name} has no postmaster"
        os.kill(pid, signal.SIGKILL)
        return pid

    def log_tails(self, lines: int = 25) -> str:
        """The last lines of etcd's and every Patroni's log, for failure messages."""
        tails = []
        for path in [self.directory / "etcd.log", *(node.log_path for node in self.nodes)]:
            try:
                text = path.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            tails.append(f"--- {path.name} ({path.parent.name})\n" + "\n".join(text))
        return "\n".join(tails)
