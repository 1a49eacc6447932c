"""The pruner: deletes finished jobs once they are past their retention.

Every worker may run one, but ``Queue.prune_expired`` deletes each small batch under a
transaction-scoped advisory lock, so at most one process deletes at a time and the
others skip their round. Batches are small and each commits on its own, so pruning a
large backlog never holds row locks for long, never blocks claims, and leaves
autovacuum a steady trickle of dead rows instead of one huge DELETE's worth.

Pruning is schema-wide, like reaping: retention is a property of the jobs table, not of
the queues a worker happens to serve, and a queue that no running worker serves would
otherwise keep its finished jobs forever. A worker started with ``--prune-interval 0``
leaves pruning to the others. The coming days of the history are not the pruner's: every
worker's day maker creates them (see :mod:`pgqueue_worker.day_maker`), pruning or not.

Dead jobs are kept longer than succeeded ones by default: they are the ones somebody
may still want to look at, or retry.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from pgqueue import JobState, Queue, ValidationError, validation
from pgqueue_worker.outage import DatabaseHealth
from pgqueue_worker.service import PeriodicService

log = logging.getLogger("pgqueue.worker")

DAY = 86_400.0
DEFAULT_PRUNE_INTERVAL = 60.0
DEFAULT_PRUNE_BATCH_SIZE = 500
# One round deletes at most this many batches (500,000 jobs), then waits for the next
# round: enough to keep up with about 8,000 finished jobs a second at the default
# interval. Each batch takes a pooled connection for one short transaction and gives it
# back, so a long round never keeps claims or acks waiting.
DEFAULT_PRUNE_MAX_BATCHES = 1000


@dataclass(frozen=True)
class Retention:
    """How long finished jobs are kept after they finished, per state, in seconds.
    0 keeps that state's jobs forever."""

    succeeded: float = 7 * DAY
    cancelled: float = 7 * DAY
    dead: float = 30 * DAY

    def __post_init__(self) -> None:
        for state in (JobState.SUCCEEDED, JobState.CANCELLED, JobState.DEAD):
            validation.seconds(f"prune_{state.value}_after", getattr(self, state.value))

    def rules(self) -> dict[str | JobState, timedelta | float]:
        """The states to prune and their retention (0 means never, so it is left out)."""
        kept = {
            JobState.SUCCEEDED: self.succeeded,
            JobState.CANCELLED: self.cancelled,
            JobState.DEAD: self.dead,
        }
        return {state: seconds for state, seconds in kept.items() if seconds > 0}

    def describe(self) -> str:
        """'succeeded after 7d, cancelled after 7d, dead after 30d' for the start-up log."""
        parts = [
            f"{state.value} after {_duration(seconds)}" if seconds > 0 else f"{state.value} never"
            for state, seconds in (
                (JobState.SUCCEEDED, self.succeeded),
                (JobState.CANCELLED, self.cancelled),
                (JobState.DEAD, self.dead),
            )
        ]
        return ", ".join(parts)


class Pruner(PeriodicService):
    """Calls ``queue.prune_expired(retention)`` every ``interval`` seconds."""

    name = "pruner"

    def __init__(
        self,
        queue: Queue,
        retention: Retention,
        *,
        interval: float = DEFAULT_PRUNE_INTERVAL,
        health: DatabaseHealth,
        batch_size: int = DEFAULT_PRUNE_BATCH_SIZE,
        max_batches: int = DEFAULT_PRUNE_MAX_BATCHES,
    ) -> None:
        validation.seconds("prune_interval", interval, positive=True)
        if batch_size < 1 or max_batches < 1:
            raise ValidationError("prune_batch_size", "batch size and batches must be positive")
        # With jitter, a fleet started together does not contend for the lock at once.
        super().__init__(interval, health, jitter=True)
        self.queue = queue
        self.retention = retention
        self.batch_size = batch_size
        self.max_batches = max_batches
        self.deleted = 0
        """Jobs this pruner deleted since it started."""

    @property
    def enabled(self) -> bool:
        """False when every state is kept forever: there is nothing to run."""
        return bool(self.retention.rules())

    def tick(self) -> bool:
        rules = self.retention.rules()
        if not rules:
            return False
        # The coming days are the day maker's (see day_maker.py), which every worker
        # runs, pruning or not.
        deleted = self.queue.prune_expired(
            rules, batch_size=self.batch_size, max_batches=self.max_batches, create_days=False
        )
        if deleted is None:
            return False  # another process holds the pruner lock; this one wrote nothing
        if deleted:
            self.deleted += deleted
            log.info("pruned %d finished jobs past their retention", deleted)
        return True


def _duration(seconds: float) -> str:
    for unit, size in (("d", DAY), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
