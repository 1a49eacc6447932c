"""What :class:`pgqueue.Queue` reports of its queues: counts per state, jobs finished per
minute, run-time histograms, all at a cost that does not grow with history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

import psycopg
import psycopg.errors

from pgqueue.errors import ValidationError
from pgqueue.job import JobState
from pgqueue.queue_base import QueueBase
from pgqueue.registry import UnservedTask


@dataclass(frozen=True)
class QueueStats:
    """Counts per state for one queue, how long its oldest runnable job has waited, and
    its operator settings (see :meth:`Queue.update_queue`)."""

    queue: str
    counts: dict[str, int]
    oldest_runnable_age_seconds: float | None
    unserved: dict[str, int] = field(default_factory=dict)
    """Per task, the queued jobs that no live worker serves (see :meth:`Queue.unserved`)."""
    paused: bool = False
    concurrency_limit: int | None = None
    """Jobs running at once across every worker, at most; None: no limit."""
    rate_limit: float | None = None
    """Jobs started per second across every worker, at most; None: no limit."""
    partition_concurrency_limit: int | None = None
    """Jobs of one partition key running at once across every worker, at most."""
    partition_rate_limit: float | None = None
    """Jobs of one partition key started per second across every worker, at most."""
    throttled_until: datetime | None = None
    """No job of the queue starts before this time (None: no throttle holds)."""


@dataclass(frozen=True)
class FinishedMinute:
    """How many jobs of one queue finished in one state during one minute (see
    :meth:`Queue.finished_per_minute`)."""

    queue: str
    state: str
    minute: datetime
    """The minute's start, on the database clock."""
    jobs: int


@dataclass(frozen=True)
class QueueMetrics:
    """One queue's figures in a :class:`MetricsSnapshot`."""

    queue: str
    jobs: dict[str, int]
    """Jobs now in each state."""
    completed: int
    """Attempts that succeeded, ever; pruning does not lower it."""
    failures: int
    """Attempts that failed or whose lease expired, ever."""
    oldest_runnable_age_seconds: float | None = None
    """How long the oldest runnable queued job has waited; None when none is."""


@dataclass(frozen=True)
class RunTimes:
    """The run-time histogram of one queue and task's succeeded attempts: seconds from
    claim to ack, on the database clock, counted by the ack statement."""

    queue: str
    task: str
    bounds: list[float]
    """Each bucket's upper bound, ascending; the last is infinity."""
    counts: list[int]
    """Attempts per bucket (not cumulative), one per bound."""
    seconds: float
    """The run times of them all, added up."""


@dataclass(frozen=True)
class PickupTimes:
    """The pickup histogram of one queue: for every attempt started, by any worker, the
    seconds from when its job became runnable (the later of its enqueue and its run_at,
    which a failure, the reaper and retry move) to its claim, on the database clock."""

    queue: str
    bounds: list[float]
    """Each bucket's upper bound, ascending; the last is infinity."""
    counts: list[int]
    """Attempts per bucket (not cumulative), one per bound."""
    seconds: float
    """The waits of them all, added up."""


@dataclass(frozen=True)
class MetricsSnapshot:
    """Every queue's figures, read in one database snapshot."""

    queues: list[QueueMetrics]
    run_times: list[RunTimes] = field(default_factory=list)
    """The run-time histogram per queue and task (see :meth:`Queue.run_times`)."""
    pickup_times: list[PickupTimes] = field(default_factory=list)
    """The pickup histogram per queue (see :meth:`Queue.pickup_times`)."""
    unserved: list[UnservedTask] = field(default_factory=list)
    """Queued jobs that no live worker serves, per queue and task (see
    :meth:`Queue.unserved`), read right after the rest."""
    workers: dict[str, int] = field(default_factory=dict)
    """Live workers serving each queue (see :meth:`Queue.workers`), read with
    ``unserved``."""


class MetricsMethods(QueueBase):
    """Counts, throughput and run times: the part of :class:`pgqueue.Queue` that
    ``pgqueue status``, ``/metrics`` and the dashboard read."""

    if TYPE_CHECKING:  # provided by RegistryMethods, beside this in Queue

        def unserved(self, *, conn: psycopg.Connection | None = None) -> list[UnservedTask]: ...

    def finished_per_minute(self, minutes: int = 60) -> list[FinishedMinute]:
        """Jobs finished per queue, state and minute over the last ``minutes`` minutes
        (the current one included), oldest first; minutes without any are left out.
        Reads only those minutes' jobs, however much history is kept."""
        if isinstance(minutes, bool) or not isinstance(minutes, int) or not 1 <= minutes <= 1440:
            raise ValidationError("minutes", "must be an integer between 1 and 1440")
        rows = self._rows("jobs_finished_per_minute", {"minutes": minutes})
        return [
            FinishedMinute(row["queue"], row["state"], row["minute"], row["jobs"]) for row in rows
        ]

    def stats(self) -> list[QueueStats]:
        """Counts per queue and state, and the oldest runnable job's age, in one snapshot.

        Queued and running jobs are counted in the table of unfinished jobs, finished ones
        read from the counters their finishing statements keep, so this costs the same
        however much history is kept. ``unserved`` comes from :meth:`unserved`, read
        right after."""
        with self._connection() as conn:
            rows = self._rows("queue_stats", conn=conn)
            unserved = self.unserved(conn=conn)
        by_queue: dict[str, dict[str, int]] = {}
        for entry in unserved:
            by_queue.setdefault(entry.queue, {})[entry.task] = entry.jobs
        return [
            QueueStats(
                queue=row["queue"],
                counts={state.value: row[state.value] for state in JobState},
                oldest_runnable_age_seconds=row["oldest_runnable_age_seconds"],
                unserved=by_queue.get(row["queue"], {}),
                paused=row["paused"],
                concurrency_limit=row["concurrency_limit"],
                rate_limit=row["rate_limit"],
                partition_concurrency_limit=row["partition_concurrency_limit"],
                partition_rate_limit=row["partition_rate_limit"],
                throttled_until=row["throttled_until"],
            )
            for row in rows
        ]

    def metrics_snapshot(self) -> MetricsSnapshot:
        """Job counts by state and completed and failed attempts of every queue, from one
        snapshot (as :meth:`stats` reads them, so the cost does not grow with history);
        and, read right after, the queued jobs no worker is taking (:meth:`unserved`),
        the run-time and the pickup histograms."""
        with self._connection() as conn:
            rows = self._rows("queue_stats", conn=conn)
            unserved = self.unserved(conn=conn)
            serving = self._rows("workers_per_queue", conn=conn)
            run_times = self.run_times(conn=conn)
            pickup_times = self.pickup_times(conn=conn)
        queues = [
            QueueMetrics(
                queue=row["queue"],
                jobs={state.value: row[state.value] for state in JobState},
                completed=row["completed"],
                failures=row["failures"],
                oldest_runnable_age_seconds=row["oldest_runnable_age_seconds"],
            )
            for row in rows
        ]
        return MetricsSnapshot(
            queues=queues,
            run_times=run_times,
            pickup_times=pickup_times,
            unserved=unserved,
            workers={row["queue"]: row["workers"] for row in serving},
        )

    def run_times(self, *, conn: psycopg.Connection | None = None) -> list[RunTimes]:
        """Per queue and task, the histogram of how long succeeded attempts ran (claim
        to ack, on the database clock), as the ack statement counts them: a few rows
        per queue and task, however much history is kept. Pruning does not lower it."""
        histograms = []
        for row in self._rows("run_time_histogram", conn=conn):
            per_bound = dict(zip(row["les"], row["attempts"], strict=True))
            bounds = list(row["bounds"])
            counts = [int(per_bound.get(bound, 0)) for bound in bounds]
            histograms.append(RunTimes(row["queue"], row["task"], bounds, counts, row["seconds"]))
        return histograms

    def pickup_times(self, *, conn: psycopg.Connection | None = None) -> list[PickupTimes]:
        """Per queue, the histogram of how long attempts waited to start: one
        observation per attempt started, by any worker, of the seconds from when its job
        became runnable (the later of its enqueue and its run_at) to its claim, on the
        database clock. Ended attempts come from the counts the statements ending them
        keep (pruning does not lower them), running ones from their rows; one snapshot."""
        histograms = []
        for row in self._rows("pickup_histogram", conn=conn):
            per_bound = dict(zip(row["les"], row["attempts"], strict=True))
            bounds = list(row["bounds"])
            counts = [int(per_bound.get(bound, 0)) for bound in bounds]
            histograms.append(PickupTimes(row["queue"], bounds, counts, row["seconds"]))
        return histograms
