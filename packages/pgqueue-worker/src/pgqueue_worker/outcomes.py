"""Writing the outcomes of finished attempts, on a thread of its own.

The claim loop hands each finished attempt's outcome here and goes straight on: while
PostgreSQL commits one batch of acks, the next claim is already running and its jobs
are being started. Outcomes that finish while a batch is being written form the next
batch, so a busy worker writes large batches and an idle one writes each outcome at
once.

A worker with nothing running does not use the writer for a lone success: its next
job waits for the next claim anyway, and the claimer sends it with it, in one
transaction (see :mod:`pgqueue_worker.claims`).

Each batch, successes and failures together, is written by one statement
(``WorkerProtocol.finish_many``, which works out each failure's backoff). Every write is guarded
by the attempt's lease token, so an outcome whose lease was lost meanwhile (cancelled, or
reaped after a stall) is refused by the database and reported back as lost. While the
database is unavailable the writer keeps the batch and retries it with backoff; if
the worker stops or dies first, the leases expire and the jobs run again.

A handler may have completed its job itself, in a transaction of its own
(``job.complete``, ``job.transaction()``). The writer then asks the database whether
that transaction committed (``WorkerProtocol.check_completions``) instead of writing
an ack: if it did, nothing is written and the outcome counts as acked, its
``on_success`` run with the result given to ``complete``; if it did not, the attempt
is written as failed (with the handler's error, or :data:`pgqueue.effects.NOT_COMMITTED`);
while it is still open, the outcome waits and is asked about again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from pgqueue import DatabaseUnavailable, Job, Lease, OutcomeBatch, Throttle, WorkerProtocol, effects
from pgqueue.effects import CompletionState
from pgqueue_worker.executor import Attempt
from pgqueue_worker.outage import Backoff, DatabaseHealth, discard_broken_connections
from pgqueue_worker.service import HandOffService

log = logging.getLogger("pgqueue.worker")

OPEN_COMPLETION_RECHECK_SECONDS = 0.5
"""How often an outcome whose completing transaction was still open when its handler
returned is asked about again."""


@dataclass(eq=False)
class Outcome:
    """A finished attempt's outcome, waiting to be written: a result, or an error."""

    attempt: Attempt
    result: Any = None
    error: BaseException | str | None = None
    sent: bool = False
    """Handed to the writer: only its report settles the outcome now (owned by the
    claim loop, like the attempt)."""
    waited: bool = False
    """Its completing transaction was found still open once (logged once)."""
    lease: Lease = field(init=False)
    """The lease the attempt was claimed under, which guards the write. A field, not a
    property: the claim loop looks each outcome up by it several times."""

    def __post_init__(self) -> None:
        self.lease = self.attempt.lease


@dataclass
class WriteReport:
    """What one round of writing settled, for the claim loop to take in."""

    acked: list[Outcome] = field(default_factory=list)
    failed: list[Outcome] = field(default_factory=list)
    """Written as failed attempts: errors, and results the database could not store."""
    lost: list[Outcome] = field(default_factory=list)
    """Refused: the lease had been lost before the outcome was written."""
    throttled: list[Outcome] = field(default_factory=list)
    """Handlers that raised :class:`pgqueue.Throttle`: their jobs were put back."""
    database_errors: int = 0
    """Tries refused by an unavailable database since the previous report."""

    def add(self, batch: list[Outcome], written: OutcomeBatch) -> None:
        """Sort the outcomes of ``batch``, which ``written`` says what became of."""
        lost = set(written.lost_leases)
        # A result the database cannot store was recorded as a failed attempt instead.
        failed = {job.id for job in written.failed}
        for outcome in batch:
            if outcome.lease in lost:
                self.lost.append(outcome)
            elif outcome.attempt.job.id in failed:
                self.failed.append(outcome)
            else:
                self.acked.append(outcome)


class OutcomeWriter(HandOffService):
    """Writes the outcomes given to :meth:`submit` through ``protocol`` and reports each
    round to ``on_written``, from its own thread. ``protocol``'s lifecycle hooks
    (``on_success``, ``on_fail``, ``on_dead``) therefore run on this thread.

    :meth:`stop` leaves outcomes not yet written to their leases."""

    name = "outcome writer"
    thread_name = "pgqueue-outcomes"

    def __init__(
        self,
        protocol: WorkerProtocol,
        *,
        health: DatabaseHealth,
        on_written: Callable[[WriteReport], None],
        on_statement: Callable[[float], None] | None = None,
    ) -> None:
        super().__init__()
        self.protocol = protocol
        self.health = health
        self.on_written = on_written
        self.on_statement = on_statement
        """Told how many seconds each batch's write took (the worker's metrics)."""
        self._waiting: list[Outcome] = []
        self._open: list[Outcome] = []
        """Outcomes whose completing transaction was still open, to ask about again at
        ``_recheck_at``."""
        self._recheck_at = 0.0

    def submit(self, outcomes: list[Outcome]) -> None:
        """Write ``outcomes`` with the next batch."""
        with self._changed:
            self._waiting.extend(outcomes)
            self._changed.notify()

    def _run(self) -> None:
        backoff = Backoff()
        report = WriteReport()
        while True:
            with self._changed:
                while not self._waiting and not self._stopping and not self._recheck_due():
                    self._changed.wait(self._recheck_in())
                if self._stopping:
                    break
                batch, self._waiting = self._waiting, []
                if self._recheck_due():
                    batch += self._open
                    self._open = []
            while batch:
                try:
                    self._write(batch, report)
                except DatabaseUnavailable as exc:
                    report.database_errors += 1
                    self.health.failed(self.name, exc)
                    discard_broken_connections(self.protocol)
                except Exception:
                    report.database_errors += 1
                    log.exception("writing %d outcomes failed; retrying with backoff", len(batch))
                else:
                    backoff.reset()
                    self.health.succeeded()
                    break
                with self._changed:
                    if self._changed.wait_for(lambda: self._stopping, backoff.next()):
                        break
            self.on_written(report)
            report = WriteReport()
        if report.database_errors:
            self.on_written(report)

    def _recheck_due(self) -> bool:
        return bool(self._open) and time.monotonic() >= self._recheck_at

    def _recheck_in(self) -> float | None:
        """Seconds until the outcomes whose completion was open are asked about again;
        None (wait for work) when there are none."""
        if not self._open:
            return None
        return max(0.0, self._recheck_at - time.monotonic())

    def _write(self, batch: list[Outcome], report: WriteReport) -> None:
        """Write ``batch`` in one statement, add each settled outcome to ``report`` and
        empty ``batch``. If the database fails, the batch is kept whole: the statement
        wrote nothing, and a retry writes it all.

        The outcomes of jobs their handler completed are asked about first (see the
        module's docstring): those whose completion committed are settled without a
        write, those still open wait for the next round."""
        started = time.monotonic()
        completed, still_open, to_write = self._sort_completed(batch)
        # Throttles are written apart: not failures, they use up no attempt. Written
        # before the rest, whose statement commits: a failed write of the rest leaves
        # them written, and the retry writes nothing more for them (their leases are
        # gone; they were settled).
        throttled = [o for o in to_write if isinstance(o.error, Throttle)]
        if throttled:
            to_write = [o for o in to_write if not isinstance(o.error, Throttle)]
            self._write_throttles(throttled, report)
            batch[:] = [o for o in batch if not isinstance(o.error, Throttle)]
        written = self.protocol.finish_many(
            [(o.attempt.job, o.result) for o in to_write if o.error is None],
            [(o.attempt.job, o.error) for o in to_write if o.error is not None],
        )
        # Refused, yet completed by the handler after it was asked about: the handler
        # was still running (an attempt past its time limit), and its completion may
        # have committed since. Asked once more.
        lost = set(written.lost_leases)
        late = [o for o in to_write if o.lease in lost and effects.completions(o.attempt.job)]
        if late:
            for outcome, check in zip(late, self._check(late), strict=True):
                if check.job is not None:
                    completed.append((outcome, check.job))
        if self.on_statement is not None:
            self.on_statement(time.monotonic() - started)
        self.protocol.settle_completed([job for _, job in completed])
        settled = {id(outcome) for outcome, _ in completed}
        report.add([o for o in to_write if id(o) not in settled], written)
        report.acked.extend(outcome for outcome, _ in completed)
        if still_open:
            self._wait_for_open(still_open)
        batch.clear()

    def _write_throttles(self, throttled: list[Outcome], report: WriteReport) -> None:
        """Put the jobs of ``throttled`` back, as each handler's Throttle asked."""
        written = set(
            self.protocol.throttle_many(
                [(o.attempt.job, cast(Throttle, o.error)) for o in throttled]
            )
        )
        for outcome in throttled:
            job = outcome.attempt.job
            if job.id in written:
                throttle = cast(Throttle, outcome.error)
                log.info(
                    "job %s throttled for %g s (scope %s)",
                    job.id,
                    throttle.seconds,
                    throttle.scope,
                    extra={"job_id": job.id, "task": job.task, "queue": job.queue},
                )
                report.throttled.append(outcome)
            else:
                report.lost.append(outcome)

    def _sort_completed(
        self, batch: list[Outcome]
    ) -> tuple[list[tuple[Outcome, Job]], list[Outcome], list[Outcome]]:
        """The outcomes of ``batch`` whose job its handler completed in a transaction
        that committed (each with the job as it left it), those whose transaction is
        still open, and the rest, to write: among them, the ones whose completion did
        not commit become failed attempts."""
        asked = [o for o in batch if effects.completions(o.attempt.job)]
        if not asked:
            return [], [], batch
        completed: list[tuple[Outcome, Job]] = []
        still_open: list[Outcome] = []
        for outcome, check in zip(asked, self._check(asked), strict=True):
            if check.job is not None:
                completed.append((outcome, check.job))
            elif check.state is CompletionState.OPEN:
                still_open.append(outcome)
            elif outcome.error is None:
                # The handler returned as if done, but what it did was rolled back:
                # the attempt fails, and is retried.
                outcome.error = effects.NOT_COMMITTED
        skipped = {id(o) for o, _ in completed} | {id(o) for o in still_open}
        return completed, still_open, [o for o in batch if id(o) not in skipped]

    def _check(self, outcomes: list[Outcome]) -> list[effects.CompletionCheck]:
        return self.protocol.check_completions([o.attempt.job for o in outcomes])

    def _wait_for_open(self, outcomes: list[Outcome]) -> None:
        """Ask about ``outcomes`` again shortly: the transaction that completed each job
        was still open when its handler returned. The job's row is held by it, so
        nothing can be written for it until it ends."""
        for outcome in outcomes:
            if not outcome.waited:
                outcome.waited = True
                job = outcome.attempt.job
                log.warning(
                    "job %s attempt %s: the handler returned with the transaction that "
                    "completed the job still open; waiting for it to commit or roll back",
                    job.id,
                    job.attempts,
                    extra={"job_id": job.id, "task": job.task, "queue": job.queue},
                )
        with self._changed:
            if not self._open:
                self._recheck_at = time.monotonic() + OPEN_COMPLETION_RECHECK_SECONDS
            self._open.extend(outcomes)
