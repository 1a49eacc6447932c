"""The claim policy of one kind of handler slot: how many jobs to claim, when to claim
again, and how fast to look again after a claim came back short.

A worker has a kind for plain functions (on threads) and one for coroutines (on its
event loop), each claimed for on its own: only its tasks, as many as its slots have
room for, at its own pace. The claim loop owns every :class:`SlotKind` (no locks), and
passes in the clock, so the policy is plain arithmetic, tested without a database.
"""

from __future__ import annotations

import math

# Claim ahead only as many jobs as the slots are expected to start within this long,
# judging by how long handlers have been running: a job claimed ahead waits about
# this long at most, so prefetch helps jobs of microseconds and leaves long ones alone.
PREFETCH_HORIZON_SECONDS = 0.1
# Weight of the latest handler's run time in the running average that judges it.
RUN_TIME_WEIGHT = 0.1
# While this kind's claims come back full of jobs with partition keys, claim again at
# least this often, for whatever room there is: another key's new job then waits about
# this long for a claim, not for half the prefetch to drain (see SlotKind.top_up_limit).
TOP_UP_SECONDS = 0.01
# First wait before looking again for a job that is runnable but was locked by another
# transaction (doubling while that lasts).
RECHECK_SECONDS = 0.01


class SlotKind:
    """One kind of handler slot and the state of its claims (see the module docstring).
    Times are the claim loop's ``time.monotonic()`` seconds."""

    __slots__ = (
        "busy",
        "claim_due",
        "found_nothing",
        "keyed_backlog",
        "last_claim_at",
        "name",
        "next_run_at",
        "recheck_delay",
        "size",
        "tasks",
        "typical_run",
    )

    def __init__(self, name: str, tasks: list[str], size: int) -> None:
        self.name = name
        self.tasks = tasks
        self.size = size
        """Slots: handlers of this kind that run at once, at most."""
        self.busy = 0
        """Attempts of this kind whose handler has not returned (running or waiting)."""
        self.typical_run: float | None = None
        """Seconds this kind's handlers take, a running average."""
        self.claim_due = True
        """Claim at the next chance: there may be more jobs, or a notification came."""
        self.last_claim_at = -math.inf
        self.next_run_at: float | None = None
        """When a job of this kind is due (or worth looking for again), if known."""
        self.recheck_delay = 0.0
        self.found_nothing = False
        """The last claim of this kind found nothing (burst mode ends on it)."""
        self.keyed_backlog = False
        """The last claim came back full of jobs with partition keys (see
        :func:`~pgqueue_worker.claim_loop.keyed_backlog` and :meth:`top_up_limit`)."""

    def describe(self) -> str:
        """For the worker's start-up line."""
        return f"{self.size} slots for {self.name} handlers"

    def started(self, attempts: int) -> None:
        """``attempts`` claimed jobs were handed to this kind's slots."""
        self.busy += attempts

    def returned(self, ran_for: float | None) -> None:
        """A handler of this kind returned after ``ran_for`` seconds (None: it never
        ran, called off while it waited for a slot)."""
        self.busy -= 1
        if ran_for is not None:
            typical = self.typical_run
            self.typical_run = (
                ran_for if typical is None else typical + RUN_TIME_WEIGHT * (ran_for - typical)
            )

    def claim_limit(self, prefetch: int) -> int:
        """How many jobs to claim now: one per free slot, and up to ``prefetch`` more,
        as many as the slots are expected to start within PREFETCH_HORIZON_SECONDS.

        Claiming ahead is what makes short jobs cheap: every claim statement, ack
        statement and commit has a cost of its own, paid once per batch, and a batch
        can be no larger than what the worker claims at once. A job claimed ahead waits
        in the executor for a slot, under its lease like any other.

        While every slot is busy, this is 0 until room for half of those jobs claimed
        ahead has opened up: the worker then tops up in a few large claims, instead of
        one small claim per handler that returns.
        """
        ahead = self._ahead(prefetch)
        room = self.size + ahead - self.busy
        if self.busy >= self.size and room < ahead // 2:
            return 0
        return room

    def top_up_limit(self, prefetch: int, now: float) -> int:
        """How many jobs to claim now beyond :meth:`claim_limit`: while the kind
        :meth:`tops_up`, whatever room there is once TOP_UP_SECONDS passed since the
        last claim; 0 otherwise.

        A claim shares its jobs between partition keys, but only a claim can: while a
        large tenant's backlog fills the worker's prefetch, another tenant's new job
        would wait for half of it to drain (tens of milliseconds of short jobs, seconds
        of long ones) before any claim sees it. Small claims this often keep that wait
        short, and the worker's slots take the keys in turns (see
        :mod:`pgqueue_worker.waiting_line`), so the job also starts soon after."""
        if not self.tops_up(prefetch) or now < self.last_claim_at + TOP_UP_SECONDS:
            return 0
        return max(0, self.size + self._ahead(prefetch) - self.busy)

    def top_up_at(self, prefetch: int) -> float | None:
        """When the next top-up claim is due, while the kind :meth:`tops_up` and has
        room (without room, the next handler to return wakes the claim loop anyway)."""
        if not self.tops_up(prefetch) or self.size + self._ahead(prefetch) <= self.busy:
            return None
        return self.last_claim_at + TOP_UP_SECONDS

    def tops_up(self, prefetch: int) -> bool:
        """Whether to claim every TOP_UP_SECONDS: beside a :attr:`keyed_backlog`, when
        the slots would take longer than that to start the jobs that :meth:`claim_limit`
        waits for. Jobs of a millisecond or less drain half the prefetch sooner: the
        next claim comes as soon anyway, and small claims in between would only cost
        the drain (every claim statement has a cost of its own)."""
        if not self.keyed_backlog:
            return False
        if self.typical_run is None:
            return True
        ahead = self._ahead(prefetch)
        waited_for = ahead // 2 - (self.size + ahead - self.busy)
        return waited_for * self.typical_run / self.size > TOP_UP_SECONDS

    def _ahead(self, prefetch: int) -> int:
        """Jobs to claim ahead of the slots: as many as they should start within
        PREFETCH_HORIZON_SECONDS, at most ``prefetch``."""
        if not prefetch or self.typical_run is None:
            return 0
        expected = self.size * PREFETCH_HORIZON_SECONDS / max(self.typical_run, 1e-6)
        return min(prefetch, int(expected))

    def due(self, now: float, poll_interval: float) -> bool:
        """Whether a claim is due now: asked for, a poll interval since the last one, or
        a job known to be due by now."""
        if self.claim_due or now >= self.last_claim_at + poll_interval:
            return True
        return self.next_run_at is not None and now >= self.next_run_at

    def claiming(self, now: float) -> None:
        """A claim for this kind is being sent."""
        self.claim_due = False
        self.last_claim_at = now
        self.next_run_at = None

    def claimed(
        self,
        jobs: int,
        limit: int,
        next_run_seconds: float | None,
        poll_interval: float,
        now: float,
        *,
        keyed_backlog: bool = False,
    ) -> None:
        """A claim for ``limit`` jobs brought ``jobs``; ``next_run_seconds`` is how long
        until the earliest queued job is due, as the claim found it (zero or less:
        one is runnable now; None: none is queued); ``keyed_backlog``: the jobs were of
        a backlog with partition keys. Decides when to look again."""
        self.keyed_backlog = keyed_backlog and jobs == limit
        if jobs == limit:
            self.claim_due = True  # there may be more
            self.recheck_delay = 0.0
            return
        seconds = next_run_seconds
        if seconds is not None and seconds <= 0:
            # Runnable, yet not claimed: another transaction holds the row (another
            # worker's claim, most likely, which commits in a moment), or the queue's
            # concurrency limit is reached. Look again soon, backing off in case a long
            # transaction holds it, or other workers hold the limit; a claim that
            # brought jobs starts again from the shortest wait, so a worker sharing a
            # limited queue takes up the room its own jobs leave.
            self.recheck_delay = (
                RECHECK_SECONDS
                if jobs
                else min(max(2 * self.recheck_delay, RECHECK_SECONDS), poll_interval)
            )
            seconds = self.recheck_delay
        else:
            self.recheck_delay = 0.0
        if seconds is not None:
            self.next_run_at = now + seconds

    def wake_times(self, retry_at: float, poll_interval: float) -> list[float]:
        """When the claim loop must wake for this kind's next claim, if it has room:
        its next poll and the next due job, neither before ``retry_at`` (an outage's
        backoff)."""
        times = [max(retry_at, self.last_claim_at + poll_interval)]
        if self.next_run_at is not None:
            times.append(max(retry_at, self.next_run_at))
        return times
