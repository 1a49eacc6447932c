"""Claiming on a thread of its own, so that the claim loop never waits for PostgreSQL.

The claim loop decides when to claim and how many jobs; the claimer runs the claim
statement, turns its rows into jobs (and, when it came back short, asks when the next
queued job becomes runnable) and hands the result back. Meanwhile the claim loop goes
on taking in finished handlers and passing their outcomes to the writer, and the slots
run the jobs claimed before: a claim's round trip and the loading of its rows overlap
with the rest of the worker's work instead of stopping it.

One claim at a time: the loop asks for the next once the last one's jobs are in hand,
so it always knows how many jobs it holds.

A claim may carry acks. When the worker has nothing running, its next job waits for
the claim anyway, and the outcome writer's separate transaction would only add a
commit per job: a lone success goes with the claim instead, in one transaction and
one round trip (``WorkerProtocol.ack_and_claim``; a batch still goes to the writer,
see ``ClaimLoop._write_and_claim``). The claimer hands
over the claimed jobs first, then settles the acks (their ``on_success`` hooks run on
its thread) and reports them as the writer does. If the transaction fails, neither
happened: the result hands the acks back to the loop, for the writer to retry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from pgqueue import AckedClaim, Job, Waiter, WorkerProtocol
from pgqueue_worker.outcomes import Outcome, WriteReport
from pgqueue_worker.service import HandOffService

log = logging.getLogger("pgqueue.worker")


@dataclass(frozen=True)
class ClaimResult:
    """What one claim brought: jobs, or the error that stopped it."""

    limit: int
    """How many jobs were asked for."""
    jobs: list[Job]
    next_run_seconds: float | None = None
    """After a short claim only: seconds until the next queued job of the worker's tasks
    is runnable (zero or less: one is runnable but was locked), None when none is queued."""
    error: Exception | None = None
    unwritten: list[Outcome] = field(default_factory=list)
    """The acks the claim carried, when its transaction failed: for the writer now."""


class Claimer(HandOffService):
    """Runs ``protocol.claim`` for the claim loop, one request at a time, and reports each
    result to ``on_claimed`` from its own thread.

    :meth:`stop` lets the claim in progress, if any, finish and report its result."""

    thread_name = "pgqueue-claims"

    def __init__(
        self,
        protocol: WorkerProtocol,
        queues: Collection[str],
        tasks: Collection[str],
        *,
        lease_seconds: float,
        worker_id: str,
        mode: str,
        on_claimed: Callable[[ClaimResult], None],
        on_written: Callable[[WriteReport], None],
        waiter_seconds: float | None = None,
    ) -> None:
        super().__init__()
        self.protocol = protocol
        self.queues = list(queues)
        self.tasks = list(tasks)
        self.lease_seconds = lease_seconds
        self.worker_id = worker_id
        self.mode = mode
        self.on_claimed = on_claimed
        self.on_written = on_written
        """Told what became of the acks a claim carried, as the outcome writer tells."""
        self.waiter_seconds = waiter_seconds
        """With a value (a worker that LISTENs), each claim says whether this worker
        waits for jobs, for that long (see :class:`pgqueue.Waiter`)."""
        self.waiters: dict[tuple[str, ...], Waiter] = {}
        """The waiter each set of tasks claimed for so far is known by."""
        self._requested: tuple[int, list[str], list[Outcome]] | None = None

    def request(
        self, limit: int, tasks: Collection[str] | None = None, acks: list[Outcome] | None = None
    ) -> None:
        """Claim up to ``limit`` jobs of ``tasks`` (default: every task the claimer
        serves), and write ``acks`` (successes) in the same transaction; the result goes
        to ``on_claimed``, then what became of the acks to ``on_written``. Only one
        claim may be asked for at a time: ask again after its result arrived."""
        with self._changed:
            if self._requested is not None:
                raise RuntimeError("a claim is already in progress")
            self._requested = (limit, self.tasks if tasks is None else list(tasks), acks or [])
            self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                while self._requested is None and not self._stopping:
                    self._changed.wait()
                if self._requested is None:
                    return
                limit, tasks, acks = self._requested
            result, settle = self._claim(limit, tasks, acks)
            with self._changed:
                self._requested = None
            self.on_claimed(result)
            if settle is not None:
                # After the claimed jobs are handed over: the acks' hooks run here, while
                # the next job starts.
                report = WriteReport()
                report.add(acks, settle.settle())
                self.on_written(report)

    def _waiter(self, tasks: list[str]) -> Waiter | None:
        """One waiter per set of tasks: a worker whose sync handlers are all busy may
        still wait for jobs of its async ones, and the other way round."""
        if self.waiter_seconds is None:
            return None
        key = tuple(sorted(tasks))
        if key not in self.waiters:
            self.waiters[key] = Waiter(f"{self.worker_id}/{len(self.waiters)}", self.waiter_seconds)
        return self.waiters[key]

    def _claim(
        self, limit: int, tasks: list[str], acks: list[Outcome]
    ) -> tuple[ClaimResult, AckedClaim | None]:
        """Claim, with ``acks`` in the same transaction if there are any."""
        options: dict[str, Any] = {
            "lease_seconds": self.lease_seconds,
            "worker_id": self.worker_id,
            "mode": self.mode,
            "waiter": self._waiter(tasks),
        }
        acked = None
        try:
            if acks:
                successes = [(outcome.attempt.job, outcome.result) for outcome in acks]
                acked = self.protocol.ack_and_claim(successes, self.queues, tasks, limit, **options)
                jobs = acked.jobs
            else:
                jobs = self.protocol.claim(self.queues, tasks, limit, **options)
        except Exception as exc:  # the claim loop decides what each failure means
            return ClaimResult(limit, [], error=exc, unwritten=acks), None
        return self._with_next_run(limit, tasks, jobs), acked

    def _with_next_run(self, limit: int, tasks: list[str], jobs: list[Job]) -> ClaimResult:
        """The result of a claim that brought ``jobs``: when they are fewer than asked
        for, with when the next queued job becomes runnable."""
        if len(jobs) == limit:
            return ClaimResult(limit, jobs)
        try:
            seconds = self.protocol.next_run_in(self.queues, tasks)
        except Exception:
            # The claim itself committed: its jobs must reach the loop. Without the
            # delay, the loop looks again at its next poll.
            log.debug("could not tell when the next job is runnable", exc_info=True)
            seconds = None
        return ClaimResult(limit, jobs, next_run_seconds=seconds)
