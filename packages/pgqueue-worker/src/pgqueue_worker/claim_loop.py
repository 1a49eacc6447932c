"""The worker's claim loop: one thread that feeds the handler slots and owns the
worker's bookkeeping.

The claim loop keeps which leases the worker holds, which attempts run, which outcomes
wait to be written (:class:`~pgqueue_worker.in_flight.InFlightAttempts`). Each round it
takes in the jobs of the last claim and the handlers that finished, hands their outcomes
to the outcome writer, and asks the claimer for as many jobs as it has room for (as its
:class:`~pgqueue_worker.claim_policy.ClaimPolicy` decides). The claimer and the writer
talk to PostgreSQL on threads of their own, so on a busy queue claims, acks and handlers
all overlap instead of taking turns: one claim statement and one outcome statement
per batch of jobs, each committed while the rest of the worker goes on.
"""

from __future__ import annotations

import logging
import queue as queue_module
import time
from typing import TYPE_CHECKING

from pgqueue import DatabaseUnavailable, Job, WorkerProtocol, effects
from pgqueue_worker.claim_policy import ClaimPolicy
from pgqueue_worker.claims import Claimer, ClaimResult
from pgqueue_worker.executor import Executor
from pgqueue_worker.handover import Handover
from pgqueue_worker.in_flight import InFlightAttempts
from pgqueue_worker.outage import DatabaseHealth, discard_broken_connections
from pgqueue_worker.outcomes import Outcome, OutcomeWriter, WriteReport
from pgqueue_worker.slots import SlotKind

if TYPE_CHECKING:
    from pgqueue_worker.worker import Worker

log = logging.getLogger("pgqueue.worker")

# Even with nothing to wait for, look around this often (a cheap safety net).
MAX_SLEEP_SECONDS = 60.0
# How long a burst worker waits before it tries again to reap when another holds the lock.
BURST_REAP_RECHECK_SECONDS = 0.1


class ClaimLoop:
    """The claim loop of ``worker``, run by :meth:`serve`: it adds up what it does in
    ``worker.counts`` and reports what the database does to ``health``.

    Everything it keeps is its own thread's, but for what other threads hand it through
    :attr:`handover`, and :meth:`stop`, which any thread or a signal handler may call.
    """

    def __init__(self, worker: Worker, health: DatabaseHealth) -> None:
        self._burst = worker.burst
        # Outcomes handed to the writer since a claim last looked: their acks, deaths
        # and cancels may have released jobs waiting for them (see
        # pgqueue.dependencies), which a claim that ran beside the write did not see.
        self._written_unseen = False
        self._give_up_after = worker.give_up_after
        self._shutdown_timeout = worker.shutdown_timeout
        self._counts = worker.counts
        self._health = health
        # Inspecting a handler costs more than running a no-op job.
        is_async = {name: h.is_async for name, h in worker.handlers.items()}
        # The kinds of slot the worker's handlers need, each claimed for on its own.
        tasks = worker.tasks
        plain = SlotKind("plain", [t for t in tasks if not is_async[t]], worker.concurrency)
        coroutines = SlotKind("async", [t for t in tasks if is_async[t]], worker.async_concurrency)
        self.claim_policy = ClaimPolicy(
            [kind for kind in (plain, coroutines) if kind.tasks],
            prefetch=worker.prefetch,
            poll_interval=worker.poll_interval,
            burst=worker.burst,
        )
        # By is_async, for the per-job bookkeeping.
        self._kind_of = (plain, coroutines)
        # Handed over from other threads; everything else is the claim loop's own.
        self.handover = Handover(self.claim_policy, worker.metrics)
        self.in_flight = InFlightAttempts(worker.handlers, is_async, worker.counts)
        self.busy = 0
        """Attempts whose handler has not returned, of every kind (each kind counts its
        own too)."""
        self._stop_requested = False
        self.gave_up: str | None = None
        """Why the loop stopped on its own, the database unavailable too long."""
        self._protocol: WorkerProtocol  # the one serve() is given, once it runs
        self._writer: OutcomeWriter  # likewise

    def stop(self) -> None:
        """Stop claiming, and return from :meth:`serve` once every outcome is written
        (after the shutdown timeout at most)."""
        self._stop_requested = True
        self.handover.wake.set()

    def serve(
        self,
        protocol: WorkerProtocol,
        executor: Executor,
        claimer: Claimer,
        writer: OutcomeWriter,
    ) -> bool:
        """Run until stopped; True when every claimed job's outcome was written or
        discarded, False when the shutdown timeout left jobs to their leases."""
        self._protocol = protocol
        self._writer = writer
        stop_deadline: float | None = None
        claim_policy = self.claim_policy
        in_flight = self.in_flight
        handover = self.handover
        while True:
            handover.rearm()
            now = time.monotonic()
            self._collect(executor, now)
            if self._give_up_after is not None and not self._stop_requested:
                self._give_up_if_down_too_long(now, self._give_up_after)

            if self._stop_requested:
                if stop_deadline is None:
                    stop_deadline = now + self._shutdown_timeout
                    log.info(
                        "stopping: claiming no more jobs; waiting up to %g s for %d running",
                        self._shutdown_timeout,
                        self.busy,
                    )
                # A claim in progress is waited for: its jobs are this worker's to run.
                if self.busy == 0 and not in_flight.pending and not claim_policy.claiming:
                    log.info("stopped cleanly")
                    return True
                if now >= stop_deadline:
                    running = in_flight.running()
                    log.warning(
                        "shutdown timeout: leaving %d running jobs (%s) to their leases",
                        self.busy,
                        ", ".join(str(a.job.id) for a in running),
                    )
                    # Their outcomes will not be written: tell handlers that look.
                    for attempt in running:
                        attempt.job.mark_cancelled()
                    return False

            if (
                self._burst
                and claim_policy.found_nothing()
                and self.busy == 0
                and not in_flight.pending
                and self._reaped_before_exit()
            ):
                if not self._written_unseen:
                    log.info("burst: no runnable job left for this worker; exiting")
                    return True
                # Every outcome is written now: one more claim sees what they released.
                self._written_unseen = False
                claim_policy.look_again()

            self._write_and_claim(claimer, writer, now)
            handover.wake.wait(self._sleep_seconds(time.monotonic(), stop_deadline))

    def _give_up_if_down_too_long(self, now: float, give_up_after: float) -> None:
        """Stop, as on :meth:`stop`, once the database has been unavailable for
        ``give_up_after`` seconds, saying why in :attr:`gave_up`."""
        down_for = self._health.down_for(now)
        if down_for < give_up_after:
            return
        cause = (self._health.explain() or "database unavailable").removeprefix(
            "database unavailable: "
        )
        self.gave_up = f"database unavailable for {down_for:.0f} s, giving up: {cause}"
        self._stop_requested = True

    def _collect(self, executor: Executor, now: float) -> None:
        """Take in claimed jobs, finished handlers, leases the heartbeat found lost, and
        timeouts."""
        handover = self.handover
        while True:
            try:
                claim = handover.claims.get_nowait()
            except queue_module.Empty:
                break
            self._take_in_claim(executor, claim)

        in_flight = self.in_flight
        returned = in_flight.returned
        take_finished = handover.finished.get_nowait
        while True:
            try:
                attempt, result, error = take_finished()
            except queue_module.Empty:
                break
            self.busy -= 1
            self._kind_of[attempt.is_async].returned(attempt.ran_for)
            returned(attempt, result, error)

        while True:
            try:
                lost = handover.lost.get_nowait()
            except queue_module.Empty:
                break
            for lease in lost:
                in_flight.lease_lost(executor, lease, "reported lost by the heartbeat")

        while True:
            try:
                report = handover.reports.get_nowait()
            except queue_module.Empty:
                break
            in_flight.take_in(report)
            self._room_freed(report)

        in_flight.time_out(now, executor)

    def _room_freed(self, report: WriteReport) -> None:
        """Outcomes written: the jobs they finished no longer count against a limit
        (of their queue, or of their partition key), so a kind whose last claim came
        back short with jobs still runnable, held back by a limit most likely, claims
        again now rather than after its backoff. Without this, a worker on a queue
        whose limit binds would start at most the limit's jobs per look."""
        if report.acked or report.failed or report.throttled:
            for kind in self._kind_of:
                if kind.recheck_delay:
                    kind.claim_due = True

    def _reaped_before_exit(self) -> bool:
        """Before a burst worker concludes that nothing is left, it reaps: a job whose
        worker died is still ``running`` until its expired lease is reaped, and would
        otherwise be left behind by a burst that found "nothing to do". True when
        nothing was left to reap; otherwise the worker looks for jobs once more (a
        reaped job is due again after its backoff, like any failed attempt).

        Reaping is schema-wide, as the reaper thread's is (see ``Reaper``)."""
        try:
            reaped = self._protocol.reap()
        except DatabaseUnavailable as exc:
            self._counts["database_errors"] += 1
            self._health.failed("burst reap", exc)
            discard_broken_connections(self._protocol)
            reaped = None
            self.claim_policy.back_off()
        if reaped == []:
            return True
        if reaped is None:
            # Another worker holds the reaper lock, reaping right now: look again shortly.
            self.claim_policy.recheck_after(BURST_REAP_RECHECK_SECONDS)
        else:
            log.info(
                "burst: reaped %d jobs whose lease expired: %s",
                len(reaped),
                ", ".join(f"{job.id} ({job.state.value})" for job in reaped[:20]),
            )
        self.claim_policy.look_again()
        return False

    def _write_and_claim(self, claimer: Claimer, writer: OutcomeWriter, now: float) -> None:
        """Hand the outcomes waiting to be written to the writer and, with room and
        reason to, ask the claimer for more jobs.

        With nothing running, the next job waits for this claim anyway: a lone success
        goes with it, one transaction and one commit for both (see
        :mod:`pgqueue_worker.claims`). A batch of outcomes goes to the writer, whose
        transaction overlaps with the claim on another connection: sent with the claim,
        a large batch's statement would hold the next jobs back for longer than the
        commit it saves (a worker draining short jobs, whose slots all empty between
        claims, was measurably slower so)."""
        idle = self.busy == 0
        claim = self.claim_policy.next_claim(now, stopping=self._stop_requested, idle=idle)
        outcomes = self.in_flight.take_unsent() if self.in_flight.unsent else []
        acks: list[Outcome] = []
        if (
            claim is not None
            and idle
            and len(outcomes) == 1
            and outcomes[0].error is None
            # A job its handler completed is asked about, not acked: the writer's.
            and not effects.completions(outcomes[0].attempt.job)
        ):
            acks, outcomes = outcomes, []
        if outcomes:
            writer.submit(outcomes)
            self._written_unseen = True
        if claim is not None:
            kind, limit = claim
            claimer.request(limit, kind.tasks, acks)

    def _take_in_claim(self, executor: Executor, claim: ClaimResult) -> None:
        """Start the jobs of a claim, and work out when to claim again."""
        kind = self.claim_policy.claim_returned()
        error = claim.error
        if claim.unwritten:
            # The claim's transaction failed with the acks it carried: the writer
            # retries them (with backoff while the database is unavailable).
            self._writer.submit(claim.unwritten)
        if error is not None:
            if isinstance(error, DatabaseUnavailable):
                self._counts["database_errors"] += 1
                self._health.failed("claim loop", error)
                discard_broken_connections(self._protocol)
            else:
                log.error("claim loop error; retrying with backoff", exc_info=error)
            self.claim_policy.claim_failed(kind)
            return
        self._health.succeeded()
        jobs = claim.jobs
        attempts = self.in_flight.open(jobs)
        self.busy += len(attempts)
        kind.started(len(attempts))
        executor.submit_many(attempts)
        self.claim_policy.claimed(
            kind,
            len(jobs),
            claim.limit,
            claim.next_run_seconds,
            idle=self.busy == 0,
            keyed_backlog=len(jobs) == claim.limit and keyed_backlog(jobs, kind.keyed_backlog),
        )

    def _sleep_seconds(self, now: float, stop_deadline: float | None) -> float:
        """How long the claim loop may sleep before something needs it (other threads,
        the claimer among them, wake it earlier through the wake signal)."""
        if (
            self._stop_requested
            and self.busy == 0
            and not self.in_flight.pending
            and not self.claim_policy.claiming
        ):
            return 0.0  # the last outcome is written: time to go
        wake_at = min(
            now + MAX_SLEEP_SECONDS,
            self.claim_policy.next_claim_at() if stop_deadline is None else stop_deadline,
            self.in_flight.next_deadline(),
        )
        return max(0.0, wake_at - now)


def keyed_backlog(jobs: list[Job], before: bool = False) -> bool:
    """Whether a full claim's ``jobs`` are of a backlog with partition keys, beside
    which the worker tops up often (see
    :meth:`~pgqueue_worker.slots.SlotKind.top_up_limit`): any job with a key says so.

    A claim shares its jobs between keys, but only a claim can. While one tenant's
    backlog fills the worker's prefetch, another tenant's first job would otherwise
    wait for half of it to drain before any claim sees it, however few jobs that
    tenant has; and a claim of one job per key (a top-up) says nothing of how long
    each key's backlog is. So the first job of a key that arrives after the backlog's
    first claim waits one top-up at most, not a large claim.

    A claim of jobs without a key only says what the claims before it said
    (``before``): between two jobs of a small tenant, the claims beside a large keyless
    backlog bring only its jobs. A queue whose jobs never have keys never tops up."""
    if any(job.partition_key is not None for job in jobs):
        return True
    return before and bool(jobs)
