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
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pgqueue import DatabaseUnavailable, Lease, OutcomeBatch, WorkerProtocol
from pgqueue_worker.executor import Attempt
from pgqueue_worker.outage import Backoff, DatabaseHealth, discard_broken_connections
from pgqueue_worker.service import HandOffService

log = logging.getLogger("pgqueue.worker")


@dataclass(eq=False)
class Outcome:
    """A finished attempt's outcome, waiting to be written: a result, or an error."""

    attempt: Attempt
    result: Any = None
    error: BaseException | str | None = None
    sent: bool = False
    """Handed to the writer: only its report settles the outcome now (owned by the
    claim loop, like the attempt)."""
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
                while not self._waiting and not self._stopping:
                    self._changed.wait()
                if self._stopping:
                    break
                batch, self._waiting = self._waiting, []
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

    def _write(self, batch: list[Outcome], report: WriteReport) -> None:
        """Write ``batch`` in one statement, add each settled outcome to ``report`` and
        empty ``batch``. If the database fails, the batch is kept whole: the statement
        wrote nothing, and a retry writes it all."""
        started = time.monotonic()
        written = self.protocol.finish_many(
            [(o.attempt.job, o.result) for o in batch if o.error is None],
            [(o.attempt.job, o.error) for o in batch if o.error is not None],
        )
        if self.on_statement is not None:
            self.on_statement(time.monotonic() - started)
        report.add(batch, written)
        batch.clear()
