"""The heartbeat: one statement per interval extends every lease the worker holds, and
renews the worker's row in the worker registry."""

from __future__ import annotations

import time
from collections.abc import Callable

from pgqueue import Lease, WorkerProtocol, WorkerRegistration
from pgqueue_worker.leases import LeaseSet
from pgqueue_worker.outage import DatabaseHealth
from pgqueue_worker.service import PeriodicService


class Heartbeat(PeriodicService):
    """Extends all of ``leases`` every ``interval`` seconds through ``protocol``, which should
    have a connection of its own so that a busy pool can never delay it.

    Leases the database no longer recognises (the job was cancelled, or reaped after
    this worker stalled) are reported to ``on_lost``; the worker then discards those
    attempts' outcomes.

    With ``worker``, the same statement renews the worker's registry row, and a worker
    that holds no lease still beats for it.
    """

    name = "heartbeat"

    def __init__(
        self,
        protocol: WorkerProtocol,
        leases: LeaseSet,
        *,
        interval: float,
        lease_seconds: float,
        health: DatabaseHealth,
        on_lost: Callable[[list[Lease]], None],
        on_beat: Callable[[float], None] | None = None,
        worker: WorkerRegistration | None = None,
    ) -> None:
        super().__init__(interval, health)
        self.protocol = protocol
        self.leases = leases
        self.lease_seconds = lease_seconds
        self.on_lost = on_lost
        self.on_beat = on_beat
        """Told how many seconds each heartbeat statement took (the worker's metrics)."""
        self.worker = worker

    def tick(self) -> bool:
        held = self.leases.snapshot()
        if not held and self.worker is None:
            return False
        started = time.monotonic()
        lost_ids = self.protocol.heartbeat(held, self.lease_seconds, worker=self.worker)
        if self.on_beat is not None:
            self.on_beat(time.monotonic() - started)
        if lost_ids:
            self.on_lost([lease for lease in held if lease.job_id in lost_ids])
        return True
