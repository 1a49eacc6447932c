"""The day maker: creates the coming days of the finished jobs' partitions.

Every worker runs one, whatever its retention and even with pruning turned off
(``--prune-interval 0``, or every state kept forever): without a day to finish into,
finished jobs go to their state's DEFAULT partition, which retention can only prune row
by row. ``Queue.create_days`` changes the history under the pruner's transaction-scoped
lock, one step at a time, so a fleet makes each day once; a round that finds every day
there reads one catalog query.

Its first round runs as the worker starts, then one every minute. Only the role that
owns the history may create partitions: under another role (see docs/roles.md) the day
maker says so once and leaves the days to the owner's ``pgqueue prune`` or ``pgqueue
migrate``.
"""

from __future__ import annotations

import logging

from pgqueue import Queue
from pgqueue_worker.outage import DatabaseHealth
from pgqueue_worker.service import PeriodicService

log = logging.getLogger("pgqueue.worker")

DEFAULT_DAYS_INTERVAL = 60.0


class DayMaker(PeriodicService):
    """Calls ``queue.create_days()`` as it starts and every ``interval`` seconds."""

    name = "day-maker"

    def __init__(
        self, queue: Queue, *, health: DatabaseHealth, interval: float = DEFAULT_DAYS_INTERVAL
    ) -> None:
        super().__init__(interval, health)
        # Without the worker's statement deadline: its steps wait two seconds at most
        # for a lock, and the one that may take long (reading a large DEFAULT partition
        # to validate a fence) holds up no ack, claim or reader. Cut off at half a
        # lease, it would be tried and cut off again every round.
        self.queue = queue.with_statement_timeout(None)
        self.created = 0
        """Days this day maker created since it started."""
        self._owner: bool | None = None
        self._told: set[str] = set()

    def initial_delay(self) -> float:
        # At once: a worker that starts after days went unmade puts them back before its
        # first jobs finish.
        return 0.0

    def tick(self) -> bool:
        owner = self.queue.owns_history()
        if owner != self._owner:
            self._owner = owner
            if not owner:
                log.info(
                    "the coming days of the finished jobs are left to the owner of "
                    "%s.finished_jobs: this role may not create partitions",
                    self.queue.schema,
                )
        if not owner:
            return False
        made = self.queue.create_days()
        if made.created:
            self.created += len(made.created)
            log.info("created the history's days %s", ", ".join(made.created))
        for name, why in made.left.items():
            # Once per day and reason: a day left now is usually left all day.
            if f"{name}: {why}" not in self._told:
                self._told.add(f"{name}: {why}")
                log.warning("%s not created: %s", name, why)
        return bool(made.created)
