"""The worker's row in the worker registry (see :mod:`pgqueue.registry`).

Written when the worker starts, renewed by every heartbeat (the heartbeat statement
carries it, so a busy worker pays no extra round trip, and an idle one sends it alone
at the heartbeat interval), deleted when the worker stops cleanly. A worker that dies
stops counting once its row expires, after WORKER_EXPIRY_BEATS heartbeat intervals (30 s
with the default 30 s leases), and the reaper of any worker deletes the row.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from pgqueue import DatabaseUnavailable, Queue, WorkerRegistration
from pgqueue.registry import WORKER_EXPIRY_BEATS

log = logging.getLogger("pgqueue.worker")


def registration(
    worker_id: str,
    queues: Collection[str],
    tasks: Collection[str],
    *,
    concurrency: int,
    heartbeat_seconds: float,
) -> WorkerRegistration:
    """What a worker with these settings says of itself in the registry."""
    return WorkerRegistration(
        id=worker_id,
        queues=sorted(queues),
        tasks=sorted(tasks),
        concurrency=concurrency,
        expiry_seconds=WORKER_EXPIRY_BEATS * heartbeat_seconds,
    )


def register(queue: Queue, worker: WorkerRegistration) -> None:
    """Add the worker to the registry. A database that cannot take it now is no reason
    not to start: the first heartbeat that gets through writes the row."""
    try:
        queue.register_worker(worker)
    except DatabaseUnavailable as exc:
        log.warning(
            "could not register in the worker registry yet (%s); retrying with the heartbeat", exc
        )


def deregister(queue: Queue, worker: WorkerRegistration) -> None:
    """Take the worker out of the registry; best effort (the row expires anyway)."""
    try:
        queue.deregister_worker(worker.id)
    except Exception:
        log.debug("could not leave the worker registry; the row will expire", exc_info=True)
