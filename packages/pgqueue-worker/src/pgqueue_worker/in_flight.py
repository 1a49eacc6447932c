"""The attempts a worker has in flight, from the claim until their outcome is settled.

An attempt is held under its lease from the claim, while its handler waits for a slot
and runs, and while its outcome waits to be written; it is settled when the outcome
writer reports the outcome written, or when the worker learns that the lease was lost
and discards the outcome. The claim loop owns this record (no locks); the heartbeat
reads the leases it holds through their :class:`~pgqueue_worker.leases.LeaseSet`.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from itertools import chain
from typing import Any

from pgqueue import Job, Lease, TaskHandler, Throttle, effects
from pgqueue_worker.executor import Attempt, Executor
from pgqueue_worker.leases import LeaseSet
from pgqueue_worker.outcomes import Outcome, WriteReport

log = logging.getLogger("pgqueue.worker")

LOST = "lost its lease"


class InFlightAttempts:
    """This worker's attempts in flight, their leases, and the outcomes waiting to be
    written, each keyed by the lease it was claimed with.

    ``handlers`` and ``is_async`` are the worker's, by task name; what happens to the
    attempts is added up in ``counts`` (the worker's ``counts``): timed_out, lost,
    succeeded, failed, and the database_errors of writing outcomes.
    """

    def __init__(
        self,
        handlers: dict[str, TaskHandler],
        is_async: dict[str, bool],
        counts: Counter[str],
    ) -> None:
        self._handlers = handlers
        self._is_async = is_async
        self._counts = counts
        self.leases = LeaseSet()
        """The leases held: the heartbeat extends them."""
        self.attempts: dict[Lease, Attempt] = {}
        self.pending: dict[Lease, Outcome] = {}
        """Outcomes not yet written; the unsent ones are also in ``unsent`` until the
        next round hands them to the writer."""
        self.unsent: list[Outcome] = []
        self._timed = 0  # attempts in `attempts` with a time limit

    def open(self, jobs: list[Job]) -> list[Attempt]:
        """An attempt for each claimed job, held under the job's lease."""
        attempts = []
        for job in jobs:
            handler = self._handlers[job.task]
            timeout = job.timeout_seconds or handler.timeout_seconds
            attempt = Attempt(
                job=job,
                lease=_lease(job),
                handler=handler,
                is_async=self._is_async[job.task],
                timeout_seconds=timeout,
            )
            self.attempts[attempt.lease] = attempt
            if timeout:
                self._timed += 1
            attempts.append(attempt)
        # Held before any handler runs, so that the heartbeat covers every claimed job.
        self.leases.add([attempt.lease for attempt in attempts])
        return attempts

    def returned(self, attempt: Attempt, result: Any, error: BaseException | None) -> None:
        """The handler of ``attempt`` returned ``result`` or raised ``error``: its
        outcome waits to be written, unless the attempt was abandoned meanwhile."""
        attempt.returned = True
        if (
            attempt.abandoned is not None
            and attempt.lease not in self.pending
            and attempt.abandoned == LOST
            and effects.completions(attempt.job)
        ):
            # Its lease was found gone as the handler's own completion committed (on a
            # connection in autocommit mode, before the completion was recorded): the
            # writer asks whether it did.
            self._wait_to_write(Outcome(attempt, result, error))
            return
        if attempt.abandoned is not None:
            log.info(
                "job %s attempt %s returned after it was %s; outcome discarded",
                attempt.job.id,
                attempt.job.attempts,
                attempt.abandoned,
                extra=_job_fields(attempt.job),
            )
            self._forget_if_done(attempt)
            return
        # A Throttle is no error: the writer logs it, in one line, once written.
        if error is not None and not isinstance(error, Throttle):
            log.info(
                "job %s %s attempt %s raised",
                attempt.job.id,
                attempt.job.task,
                attempt.job.attempts,
                exc_info=error,
                extra=_job_fields(attempt.job),
            )
        # As _wait_to_write does, without a second call per job.
        outcome = Outcome(attempt, result, error)
        self.pending[attempt.lease] = outcome
        self.unsent.append(outcome)

    def time_out(self, now: float, executor: Executor) -> None:
        """Fail the attempts whose deadline passed, and call off their handlers."""
        for _, attempt in list(self._timed_attempts()):
            if (
                attempt.deadline is not None
                and now >= attempt.deadline
                and not attempt.returned
                and attempt.abandoned is None
            ):
                attempt.abandoned = f"timed out after {attempt.timeout_seconds:g} s"
                self._counts["timed_out"] += 1
                self._wait_to_write(Outcome(attempt, error=attempt.abandoned))
                executor.cancel(attempt)

    def lease_lost(self, executor: Executor, lease: Lease, how: str) -> None:
        """The heartbeat found ``lease`` lost: call off its attempt and discard the
        outcome, unless the outcome is being written (its write is guarded by the
        lease)."""
        attempt = self.attempts.get(lease)
        if attempt is None or not self.leases.holds(lease):
            return  # its outcome was written meanwhile: the heartbeat raced the ack
        if effects.completions(attempt.job):
            # The handler completed the job itself: the lease is gone because that
            # completion committed, or, if it did not, the writer finds out once the
            # handler returns. Nothing to extend any more; nothing to call off.
            self.leases.release([lease])
            return
        outcome = self.pending.get(lease)
        if outcome is not None and outcome.sent:
            # Being written: the heartbeat may have seen the ack commit before the writer
            # reported it. The write is guarded by the lease, so its report settles it.
            return
        self.pending.pop(lease, None)
        self.leases.release([lease])
        if not attempt.returned and attempt.abandoned is None:
            attempt.abandoned = LOST
            executor.cancel(attempt)
        self._discarded(attempt, f"its lease was {how} (cancelled, or reaped after a stall)")
        self._forget_if_done(attempt)

    def take_unsent(self) -> list[Outcome]:
        """The outcomes to hand to the writer now, marked sent."""
        # Skipping any whose lease the heartbeat found lost since.
        sending = [o for o in self.unsent if self.pending.get(o.lease) is o]
        for outcome in sending:
            outcome.sent = True
        self.unsent = []
        return sending

    def take_in(self, report: WriteReport) -> None:
        """Settle what the writer wrote: count it and stop holding its leases."""
        self._counts["succeeded"] += len(report.acked)
        self._counts["failed"] += len(report.failed)
        self._counts["throttled"] += len(report.throttled)
        if report.database_errors:
            self._counts["database_errors"] += report.database_errors
        for outcome in report.lost:
            # Unless the heartbeat found the lease lost first, and it was counted then.
            if self.pending.get(outcome.lease) is outcome:
                self._discarded(
                    outcome.attempt, "its lease was lost before its outcome was written"
                )
        settled = []
        pending = self.pending
        for outcome in chain(report.acked, report.failed, report.lost, report.throttled):
            lease = outcome.lease
            # One lookup in the common case (a busy worker settles thousands of outcomes
            # a second): take the outcome out, and put back one that is not this
            # report's to settle.
            current = pending.pop(lease, None)
            if current is not outcome:
                if current is not None:
                    pending[lease] = current
                continue
            settled.append(lease)
            self._forget_if_done(outcome.attempt)
        self.leases.release(settled)

    def next_deadline(self) -> float:
        """The earliest deadline of an attempt still running (monotonic; infinity when
        none is)."""
        deadline = math.inf
        for _, attempt in self._timed_attempts():
            # An attempt waiting for a slot has no deadline yet: its start wakes the loop.
            if attempt.deadline is not None and attempt.abandoned is None and not attempt.returned:
                deadline = min(deadline, attempt.deadline)
        return deadline

    def running(self) -> list[Attempt]:
        """The attempts whose handler has not returned: running, or waiting for a slot."""
        return [attempt for attempt in self.attempts.values() if not attempt.returned]

    def _wait_to_write(self, outcome: Outcome) -> None:
        self.pending[outcome.lease] = outcome
        self.unsent.append(outcome)

    def _forget_if_done(self, attempt: Attempt) -> None:
        lease = attempt.lease
        if not attempt.returned or lease in self.pending:
            return
        # Popped, not looked up and then deleted: one lookup fewer per job.
        if self.attempts.pop(lease, None) is not None and attempt.timeout_seconds:
            self._timed -= 1

    def _timed_attempts(self) -> list[tuple[Lease, Attempt]]:
        """The attempts with a time limit (most jobs have none: skip the scan)."""
        if not self._timed:
            return []
        return [(lease, a) for lease, a in self.attempts.items() if a.timeout_seconds]

    def _discarded(self, attempt: Attempt, why: str) -> None:
        self._counts["lost"] += 1
        log.warning(
            "job %s attempt %s: %s; outcome discarded",
            attempt.job.id,
            attempt.job.attempts,
            why,
            extra=_job_fields(attempt.job),
        )


def _lease(job: Job) -> Lease:
    assert job.lease_token is not None
    return Lease(job.id, job.lease_token)


def _job_fields(job: Job) -> dict[str, Any]:
    return {"job_id": job.id, "task": job.task, "queue": job.queue, "attempt": job.attempts}
