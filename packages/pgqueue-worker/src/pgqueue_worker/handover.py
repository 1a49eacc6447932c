"""What the worker's other threads hand to its claim loop, and the wake-up that tells it.

The handlers' slots, the claimer, the outcome writer, the heartbeat and the listener
each call one method of :class:`Handover` from their own thread. The method puts what
it has on a queue the claim loop drains each round, then wakes the loop, so the claim
loop owns all of the worker's bookkeeping without a lock.
"""

from __future__ import annotations

import queue as queue_module
from typing import Any

from pgqueue import Lease
from pgqueue_worker.claim_policy import ClaimPolicy
from pgqueue_worker.claims import ClaimResult
from pgqueue_worker.executor import Attempt
from pgqueue_worker.metrics import WorkerMetrics
from pgqueue_worker.outcomes import WriteReport
from pgqueue_worker.wakeup import WakeSignal


class Handover:
    """The claim loop's inbox: claims that came back, handlers that finished, outcomes
    written, leases found lost, and notifications (which make a claim due at once
    through ``claim_policy``). Handlers' returns and claims are also reported to
    ``metrics``, if the worker keeps them."""

    def __init__(self, claim_policy: ClaimPolicy, metrics: WorkerMetrics | None) -> None:
        self._claim_policy = claim_policy
        self._metrics = metrics
        self.wake = WakeSignal()
        # True from the first wake-up sent until the claim loop takes them in: later
        # senders skip the write (a busy worker finishes a handler every few µs).
        self._wake_sent = False
        self.finished: queue_module.SimpleQueue[tuple[Attempt, Any, BaseException | None]] = (
            queue_module.SimpleQueue()
        )
        self.lost: queue_module.SimpleQueue[list[Lease]] = queue_module.SimpleQueue()
        self.reports: queue_module.SimpleQueue[WriteReport] = queue_module.SimpleQueue()
        self.claims: queue_module.SimpleQueue[ClaimResult] = queue_module.SimpleQueue()

    def rearm(self) -> None:
        """Called by the claim loop before it takes in what was handed over: forget the
        wake-ups sent, and let the next sender wake the loop again."""
        # Clear first, then allow new wake-ups. The other order loses one: a sender
        # between the two would set the flag, have its byte drained by the clear,
        # and leave the flag up, so that every later sender skips the write and a
        # loop with all slots busy sleeps until MAX_SLEEP_SECONDS. Data handed over
        # before a skipped wake-up is taken in by the claim loop just after this.
        self.wake.clear()
        self._wake_sent = False

    def handler_started(self, attempt: Attempt) -> None:
        """A handler with a time limit started: the loop must wake at its deadline."""
        self.poke()

    def handler_finished(self, attempt: Attempt, result: Any, error: BaseException | None) -> None:
        """The handler of ``attempt`` returned ``result`` or raised ``error``."""
        if self._metrics is not None:
            self._metrics.returned(attempt)
        self.finished.put((attempt, result, error))
        self.poke()

    def outcomes_written(self, report: WriteReport) -> None:
        """The outcome writer's report of a round."""
        self.reports.put(report)
        self.poke()

    def leases_lost(self, leases: list[Lease]) -> None:
        """The heartbeat found ``leases`` lost (cancelled, or reaped after a stall)."""
        self.lost.put(leases)
        self.poke()

    def claimed(self, claim: ClaimResult) -> None:
        """The claimer's result."""
        if self._metrics is not None:
            self._metrics.claimed(claim)
        self.claims.put(claim)
        self.poke()

    def notified(self) -> None:
        """A job was enqueued in a queue the worker serves (or the listener is back)."""
        self._claim_policy.claim_due = True
        self.poke()

    def poke(self) -> None:
        """Wake the claim loop, unless a wake-up it has not taken in is on its way.
        Callers hand their data over first, so the loop finds it either way."""
        if not self._wake_sent:
            self._wake_sent = True
            self.wake.set()
