"""When the claim loop claims, for which kind of handler slot, and how many jobs.

Each kind of slot keeps its own pace (see :class:`~pgqueue_worker.slots.SlotKind`);
this module decides between the kinds, one claim in progress at a time, and holds back
after a claim failed.
"""

from __future__ import annotations

import math
import time

from pgqueue_worker.outage import Backoff
from pgqueue_worker.slots import SlotKind


class ClaimPolicy:
    """Decides each round of the claim loop whether to ask the claimer for jobs, for
    which kind of slot and how many, and when the loop must wake for the next claim.

    A kind is claimed for when it has room and a claim is due: a notification came,
    its last claim came back full, a poll interval passed, or a job is known to be due
    (:meth:`~pgqueue_worker.slots.SlotKind.due`). One claim is in progress at most, so
    the claim loop never waits on the database; the kinds take turns, so that a queue
    full of one kind never keeps the other's slots idle. After a failed claim (the
    database down, most likely) the next waits for a growing backoff.

    The claim loop owns this object and its kinds (no locks), except :attr:`claim_due`,
    which a notification sets from the listener's thread.
    """

    __slots__ = (
        "_backoff",
        "burst",
        "claim_due",
        "claiming",
        "claiming_kind",
        "kinds",
        "poll_interval",
        "prefetch",
        "retry_at",
    )

    def __init__(
        self, kinds: list[SlotKind], *, prefetch: int, poll_interval: float, burst: bool
    ) -> None:
        self.kinds = kinds
        """In claim order: the one claimed for last moves to the end."""
        self.claim_due = True
        """Set by notifications: every kind is due for a claim (a plain flag, read each
        round)."""
        self.claiming = 0
        """Jobs asked of the claimer and not yet received (0: no claim in progress)."""
        self.claiming_kind: SlotKind | None = None
        """The kind the claim in progress is for."""
        self.retry_at = 0.0
        """During an outage, no claim before this (monotonic)."""
        self._backoff = Backoff()
        self.prefetch = prefetch
        self.poll_interval = poll_interval
        self.burst = burst

    def next_claim(self, now: float, *, stopping: bool, idle: bool) -> tuple[SlotKind, int] | None:
        """The kind to claim for now and how many jobs, if a claim is due; it is then in
        progress until :meth:`claim_returned`. ``idle``: no handler has yet to return."""
        if self.claiming or now < self.retry_at:
            return None
        if self.claim_due:
            # Taken down before the claim: a notification that arrives meanwhile sets it
            # again, so a job committed just after the claim's snapshot is not missed.
            self.claim_due = False
            for kind in self.kinds:
                kind.claim_due = True
        kinds = self.kinds
        for index, kind in enumerate(kinds):
            limit = kind.claim_limit(self.prefetch) or kind.top_up_limit(self.prefetch, now)
            if not self._should_claim(now, kind, limit, stopping=stopping, idle=idle):
                continue
            kind.claiming(now)
            self.claiming = limit
            self.claiming_kind = kind
            if len(kinds) > 1:
                # The other kind goes first next time: while both have jobs and room,
                # claims take turns, and neither kind waits behind the other's.
                kinds.append(kinds.pop(index))
            return kind, limit
        return None

    def _should_claim(
        self, now: float, kind: SlotKind, free: int, *, stopping: bool, idle: bool
    ) -> bool:
        if stopping or free < 1:
            return False
        # In burst mode an idle worker looks once more before it concludes it is done.
        return kind.due(now, self.poll_interval) or (self.burst and idle)

    def claim_returned(self) -> SlotKind:
        """The claim in progress came back: returns the kind it was for."""
        kind = self.claiming_kind
        assert kind is not None
        self.claiming = 0
        self.claiming_kind = None
        return kind

    def claim_failed(self, kind: SlotKind) -> None:
        """A claim for ``kind`` failed: hold back before the next."""
        kind.found_nothing = False
        self.back_off()

    def back_off(self) -> None:
        """Send no claim before the next backoff delay has passed."""
        self.retry_at = time.monotonic() + self._backoff.next()

    def recheck_after(self, seconds: float) -> None:
        """Send no claim for ``seconds``, or until the backoff in force ends if later."""
        self.retry_at = max(self.retry_at, time.monotonic() + seconds)

    def claimed(
        self,
        kind: SlotKind,
        jobs: int,
        limit: int,
        next_run_seconds: float | None,
        *,
        idle: bool,
        keyed_backlog: bool = False,
    ) -> None:
        """A claim for ``limit`` jobs of ``kind`` brought ``jobs``, their handlers now in
        the executor (see :meth:`~pgqueue_worker.slots.SlotKind.claimed`)."""
        self._backoff.reset()
        self.retry_at = 0.0
        # An empty claim ends a burst only when nothing runs: a running job may yet fail
        # and be due again, or enqueue a job of either kind, so an idle burst worker
        # looks once more for each kind (_should_claim).
        if jobs:
            for each in self.kinds:
                each.found_nothing = False
        else:
            kind.found_nothing = idle
        kind.claimed(
            jobs,
            limit,
            next_run_seconds,
            self.poll_interval,
            time.monotonic(),
            keyed_backlog=keyed_backlog,
        )

    def found_nothing(self) -> bool:
        """No claim is in progress, and the last claim of every kind found nothing."""
        return not self.claiming and all(kind.found_nothing for kind in self.kinds)

    def look_again(self) -> None:
        """Forget that the last claims found nothing: there may be jobs again."""
        for kind in self.kinds:
            kind.found_nothing = False

    def next_claim_at(self) -> float:
        """When the claim loop must wake for the next claim of a kind with room
        (monotonic; infinity while a claim is in progress)."""
        if self.claiming:
            return math.inf
        wake_at = [math.inf]
        for kind in self.kinds:
            if kind.claim_limit(self.prefetch) > 0:
                wake_at.extend(kind.wake_times(self.retry_at, self.poll_interval))
            top_up_at = kind.top_up_at(self.prefetch)
            if top_up_at is not None:
                wake_at.append(max(self.retry_at, top_up_at))
        return min(wake_at)
