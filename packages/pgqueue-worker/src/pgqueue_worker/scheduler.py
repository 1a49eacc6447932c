"""The scheduler: enqueues the jobs of periodic schedules, one per tick.

Every worker runs one unless started with ``--no-scheduler``. Each round,
``Queue.run_due_schedules`` takes a transaction-scoped advisory lock, so one worker
at a time enqueues the due ticks and moves the schedules on (see
:mod:`pgqueue.schedule_store`); the others skip that round. Whichever worker takes the
lock holds the scheduler role for that round, and keeps it by being first to the next
tick: it sleeps until the next tick is due on the database's clock (at most
``interval``, 1 s), while the others look ``FOLLOWER_GRACE`` later. So a second-by-
second schedule fires on time, and a role whose worker died moves on by itself: the
server ends a killed worker's transaction at once (a frozen one's after 5 s idle), and
another worker takes the lock in its next round, within ``interval`` plus
``FOLLOWER_GRACE`` (1.25 s) of that.

The worker syncs its plugins' schedules to the database when it starts, before it
claims anything (with ``--no-scheduler`` too). A database that is down delays the sync,
not the worker's start: the scheduler's first round does it then.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from pgqueue import DatabaseUnavailable, Queue
from pgqueue.schedules import Schedule
from pgqueue_worker.outage import DatabaseHealth
from pgqueue_worker.service import PeriodicService

log = logging.getLogger("pgqueue.worker")

DEFAULT_SCHEDULER_INTERVAL = 1.0
"""The longest a worker goes without looking for due schedules."""
FOLLOWER_GRACE = 0.25
"""A worker that did not hold the role last round looks this long after a tick is due,
so the one that did takes it (a takeover costs that much lateness, once)."""
TICK_MARGIN = 0.002
"""Added to a sleep until a tick, so that the tick has come when the round runs."""


@dataclass(frozen=True)
class ScheduleSync:
    """What a worker syncs when it starts: the schedules its plugins declare, and the
    names of every plugin it loaded (a row of one of these plugins that is no longer
    declared is disabled; rows of other plugins are left alone)."""

    declared: Mapping[str, Schedule]
    plugins: Collection[str]


class Scheduler(PeriodicService):
    """Syncs ``sync`` once, then (if ``run``) calls ``queue.run_due_schedules()`` at
    each due tick, and at least every ``interval`` seconds."""

    name = "scheduler"

    def __init__(
        self,
        queue: Queue,
        *,
        health: DatabaseHealth,
        sync: ScheduleSync | None = None,
        run: bool = True,
        interval: float = DEFAULT_SCHEDULER_INTERVAL,
    ) -> None:
        super().__init__(interval, health, jitter=True)
        self.queue = queue
        self._sync = sync
        self.run = run
        self.leading = False
        """True when this worker held the scheduler role in its last round."""
        self.enqueued = 0
        """Jobs this scheduler enqueued."""
        self._delay = interval

    def sync_now(self) -> None:
        """The sync, before the worker claims anything (so that even a ``--burst``
        worker that is done at once has synced): if the database cannot take it now,
        the scheduler's thread tries again in its rounds."""
        if self._sync is None:
            return
        try:
            self._sync_once()
        except DatabaseUnavailable as exc:
            log.warning("could not sync the schedules yet (%s); retrying", exc)

    def _sync_once(self) -> None:
        assert self._sync is not None
        report = self.queue.sync_schedules(self._sync.declared, self._sync.plugins)
        log.info(
            "schedules synced: %d added, %d updated, %d disabled, %d unchanged",
            len(report.added),
            len(report.updated),
            len(report.removed),
            len(report.unchanged),
        )
        self._sync = None

    def tick(self) -> bool:
        wrote = False
        if self._sync is not None:
            self._sync_once()
            wrote = True
        if not self.run:
            self._stopped.set()  # --no-scheduler: the sync was all there was to do
            return wrote
        done = self.queue.run_due_schedules()
        # The role is kept by the worker that got there first, and passes to one that
        # finds a tick still due: the holder is gone, or too late. A follower whose
        # round finds nothing due (the holder did it) stays a follower.
        leading = done.ran and (self.leading or bool(done.runs))
        if leading and not self.leading:
            log.info("this worker now holds the scheduler role")
        self.leading = leading
        self.enqueued += sum(1 for run in done.runs if run.created)
        self._delay = self._delay_until(done.next_due_seconds)
        return wrote or done.ran

    def _delay_until(self, due: float | None) -> float:
        if due is None:
            return self.interval
        wait = due + (TICK_MARGIN if self.leading else FOLLOWER_GRACE)
        return min(self.interval, max(TICK_MARGIN, wait))

    def next_delay(self) -> float:
        return self._delay
