"""The CPU time a PostgreSQL server on this machine has used: the figure a benchmark
divides by its jobs for the server's CPU per job.

Unlike a rate, CPU seconds barely move when other programs busy the machine, so two
builds compared on CPU per job differ by what each makes the server do, not by what
else ran at the time.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable
from typing import NamedTuple

import psutil
import psycopg

from pgqueue_bench.sql.queries import one_row, statement

# Reads the server's CPU seconds so far: postgres_cpu_seconds bound to a postmaster.
ServerCpu = Callable[[], float]


def postgres_cpu_seconds(postmaster_pid: int) -> float:
    """CPU seconds used so far by a PostgreSQL server: the postmaster, its live children
    (backends, autovacuum, checkpointer, WAL writer) and the children that have exited,
    whose time the kernel adds to the postmaster's once it has reaped them."""
    postmaster = psutil.Process(postmaster_pid)
    own = postmaster.cpu_times()
    total = own.user + own.system + own.children_user + own.children_system
    for child in postmaster.children():
        with contextlib.suppress(psutil.NoSuchProcess):
            times = child.cpu_times()
            total += times.user + times.system
    return total


def server_cpu_of(url: str) -> ServerCpu | None:
    """The reader of the CPU time of the server at ``url``, when it runs on this machine."""
    postmaster = local_postmaster_pid(url)
    if postmaster is None:
        return None
    return functools.partial(postgres_cpu_seconds, postmaster)


def processes_cpu_seconds(pids: Iterable[int]) -> float:
    """CPU seconds used so far by the processes ``pids`` (those that have exited count
    nothing): a benchmark's client processes."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


class CpuSpent(NamedTuple):
    """CPU seconds used so far, or between two readings: by a benchmark's client
    processes, and by the server (None when it runs on another machine)."""

    clients: float
    server: float | None

    @classmethod
    def now(cls, pids: Iterable[int], server_cpu: ServerCpu | None) -> CpuSpent:
        """A reading of ``pids`` and of the server ``server_cpu`` reads."""
        return cls(processes_cpu_seconds(pids), None if server_cpu is None else server_cpu())

    def since(self, earlier: CpuSpent) -> CpuSpent:
        """What was spent from ``earlier`` to this reading."""
        server = (
            None if self.server is None or earlier.server is None else self.server - earlier.server
        )
        return CpuSpent(self.clients - earlier.clients, server)


def local_postmaster_pid(url: str) -> int | None:
    """The pid of the postmaster serving ``url``, if it runs on this machine (the parent
    of this connection's backend, when that process is ours to see), else None."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        backend = int(one_row(conn.execute(statement("backend_pid")))[0])
        # While the connection is open: its backend exits once it closes.
        try:
            process = psutil.Process(backend)
            # A server on another machine has backends whose pids may still name some
            # process here: only a postgres process is its backend.
            if process.name() not in ("postgres", "postmaster"):
                return None
            parent = process.parent()
        except psutil.Error:
            return None  # another machine's (or a container's) process
    return None if parent is None else parent.pid


def backends_of(postmaster_pid: int, database: str) -> int:
    """How many of the server's processes serve ``database`` now (a backend's title
    names its database), for waiting until the clients that left have been reaped."""
    count = 0
    for child in psutil.Process(postmaster_pid).children():
        with contextlib.suppress(psutil.Error):
            title = child.cmdline()
            if title and f" {database} " in f" {' '.join(title)} ":
                count += 1
    return count
