"""The worker registry, and the queued jobs that no live worker serves.

Each ``pgqueue worker`` keeps a row in the ``workers`` table: written when it starts
(:meth:`RegistryMethods.register_worker`), renewed by the heartbeat it sends anyway
(``WorkerProtocol.heartbeat(..., worker=...)``), deleted when it stops
(:meth:`RegistryMethods.deregister_worker`). A worker that dies stops counting once its
row expires (three heartbeat intervals, 30 s by default) and the reaper deletes it.

The table is unlogged (a row is rewritten at every beat): a crash or a failover empties
it, and the next beat of each worker writes its row again. ``workers_kept_since`` says
since when the registry is kept, so that :meth:`RegistryMethods.unserved_tasks` names no
task until every live worker has had time to come back.

:class:`RegistryMethods` is part of :class:`pgqueue.Queue`; it speaks SQL only through
the Queue's named statements.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

import psycopg

from pgqueue import validation
from pgqueue.settings import DEFAULT_LEASE_SECONDS

WORKER_EXPIRY_BEATS = 3
"""A worker's row expires after this many of its heartbeat intervals without a beat."""
DEFAULT_WORKER_EXPIRY_SECONDS = WORKER_EXPIRY_BEATS * DEFAULT_LEASE_SECONDS / 3
"""A worker's row expires after this long by default: ``pgqueue worker`` beats every
third of its lease (30 s by default)."""


def pgqueue_version() -> str:
    """The installed pgqueue-core's version."""
    try:
        return metadata.version("pgqueue-core")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class WorkerRegistration:
    """What a worker says of itself in the registry."""

    id: str
    queues: list[str]
    tasks: list[str]
    concurrency: int
    """Jobs it can run at once (all its handler slots)."""
    expiry_seconds: float
    """How long its row counts without a heartbeat."""
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    version: str = field(default_factory=pgqueue_version)
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    def __post_init__(self) -> None:
        validation.seconds("expiry_seconds", self.expiry_seconds, positive=True)

    def params(self) -> dict[str, Any]:
        """The ``worker_*`` parameters of ``worker_register`` and ``job_heartbeat_many``."""
        return {
            "worker_id": self.id,
            "worker_host": self.host,
            "worker_pid": self.pid,
            "worker_version": self.version,
            "worker_queues": list(self.queues),
            "worker_tasks": list(self.tasks),
            "worker_concurrency": self.concurrency,
            "worker_started_at": self.started_at,
            "worker_seconds": self.expiry_seconds,
        }


NO_WORKER: dict[str, Any] = {
    name: None for name in WorkerRegistration("-", [], [], 0, 1.0, "-", 0, "-").params()
}
"""``job_heartbeat_many``'s worker parameters for a heartbeat that renews no registry row."""


@dataclass(frozen=True)
class WorkerInfo:
    """A live worker, as the registry shows it."""

    id: str
    host: str
    pid: int
    version: str
    queues: list[str]
    tasks: list[str]
    concurrency: int
    started_at: datetime
    last_seen_at: datetime
    running: int
    """Jobs it holds claimed now: running, or claimed ahead and waiting for a slot."""

    def to_dict(self) -> dict[str, Any]:
        """As plain data (JSON-ready but for the datetimes)."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class UnservedTask:
    """Queued jobs of one queue and task that no live worker serves."""

    queue: str
    task: str
    jobs: int
    """How many are queued."""


class RegistryMethods:
    """The registry's part of :class:`pgqueue.Queue` (which provides ``_rows``)."""

    _rows: Any

    def register_worker(self, worker: WorkerRegistration) -> None:
        """Add ``worker`` to the registry (or renew its row, if it is there)."""
        self._rows("worker_register", worker.params())

    def deregister_worker(self, worker_id: str) -> None:
        """Take a worker that stops out of the registry."""
        self._rows("worker_deregister", {"worker_id": worker_id})

    def workers(self) -> list[WorkerInfo]:
        """The live workers (rows not expired), by host and pid, each with the number of
        jobs it holds claimed now."""
        return [
            WorkerInfo(
                id=row["id"],
                host=row["host"],
                pid=row["pid"],
                version=row["version"],
                queues=list(row["queues"]),
                tasks=list(row["tasks"]),
                concurrency=row["concurrency"],
                started_at=row["started_at"],
                last_seen_at=row["last_seen_at"],
                running=row["running"],
            )
            for row in self._rows("worker_list")
        ]

    def unserved(self, *, conn: psycopg.Connection | None = None) -> list[UnservedTask]:
        """Queued jobs, per queue and task, that no live worker serves: no worker in the
        registry serves both their queue and their task (a misspelt task name, a
        handler that was removed, a queue nobody serves). Jobs of a paused queue whose
        task a worker serves are not unserved: they wait for the queue's resume.

        Workers that are not ``pgqueue worker`` processes (a claim loop of your own) are
        not in the registry unless they call :meth:`register_worker` and renew it."""
        rows = self._rows("jobs_unserved", conn=conn)
        return [UnservedTask(row["queue"], row["task"], row["jobs"]) for row in rows]

    def unserved_tasks(self, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Of the ``(queue, task)`` pairs given, those no live worker serves, sorted.

        None while the registry may be missing rows of live workers: it is unlogged, so
        a crash or a failover empties it, and a clean restart keeps rows that expired
        while the server was down. From the first worker's write after that, every live
        worker has written its row again within the longest expiry of the rows (at
        least :data:`DEFAULT_WORKER_EXPIRY_SECONDS`); until then, an unserved task and
        one whose workers have not beaten yet look the same, and none is named."""
        if not pairs:
            return []
        rows = self._rows(
            "tasks_unserved",
            {
                "queues": [queue for queue, _ in pairs],
                "tasks": [task for _, task in pairs],
                "registry_window": DEFAULT_WORKER_EXPIRY_SECONDS,
            },
        )
        return [(row["queue"], row["task"]) for row in rows]


__all__ = [
    "DEFAULT_WORKER_EXPIRY_SECONDS",
    "NO_WORKER",
    "WORKER_EXPIRY_BEATS",
    "RegistryMethods",
    "UnservedTask",
    "WorkerInfo",
    "WorkerRegistration",
    "pgqueue_version",
]
