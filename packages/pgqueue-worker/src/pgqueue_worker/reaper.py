"""The reaper: puts jobs whose lease expired back to queued, or dead-letters them.

Every worker runs one, but ``WorkerProtocol.reap`` takes a transaction-scoped advisory lock, so
at most one reaps at a time and the others skip their turn.

Reaping is schema-wide: a worker reaps the expired leases of every queue in its schema,
not only of the queues it serves. A worker that crashed while running jobs of a queue no
other running worker serves must still have them put back (and counted as failed
attempts) without waiting for a worker of that queue; and whichever worker reaps, the
jobs go back to their own queue, for their own workers to claim. Lifecycle hooks for the
reaped jobs (``on_fail``, and ``on_dead`` at the last attempt) run in the process that
reaped them, after the reap committed.
"""

from __future__ import annotations

import logging

from pgqueue import WorkerProtocol
from pgqueue_worker.outage import DatabaseHealth
from pgqueue_worker.service import PeriodicService

log = logging.getLogger("pgqueue.worker")


class Reaper(PeriodicService):
    """Calls ``protocol.reap()`` every ``interval`` seconds."""

    name = "reaper"

    def __init__(
        self, protocol: WorkerProtocol, *, interval: float, health: DatabaseHealth
    ) -> None:
        super().__init__(interval, health, jitter=True)
        self.protocol = protocol

    def tick(self) -> bool:
        reaped = self.protocol.reap()
        if reaped is None:
            return False  # another worker holds the reaper lock; this one wrote nothing
        if reaped:
            log.info(
                "reaped %d jobs whose lease expired: %s",
                len(reaped),
                ", ".join(f"{job.id} ({job.state.value})" for job in reaped[:20]),
            )
        return True
