"""The worker: one claim loop feeding N handler slots, with every job under a lease.

The claim loop owns this worker's bookkeeping: which leases it holds, which attempts
run, which outcomes wait to be written. Each round it takes in the jobs of the last
claim and the handlers that finished, hands their outcomes to the outcome writer, and
asks the claimer for as many jobs as it has room for. The claimer and the writer talk
to PostgreSQL on threads of their own, so on a busy queue claims, acks and handlers
all overlap instead of taking turns: one claim statement and one ack statement per
batch of jobs, each committed while the rest of the worker goes on.

Around it run five helpers, each on a thread of its own: the claimer, the outcome
writer, the heartbeat (one statement per interval extends every lease this worker
holds, on a connection of its own), the reaper (puts expired leases back, at most one
worker at a time), and the listener (LISTEN/NOTIFY wake-ups, polling as the fallback).

Delivery is at least once. An outcome is written only under the lease it was claimed
with, so a worker that lost its lease (cancelled, or reaped after a stall) can never
overwrite what another attempt did. An outcome that cannot be written (the database is
down) is retried until it is, while the lease lasts; if the worker dies first, or the
lease expires, the job runs again.
"""

from __future__ import annotations

import logging
import queue as queue_module
import time
from collections import Counter
from collections.abc import Collection, Mapping

from pgqueue import DatabaseUnavailable, Queue, TaskHandler, ValidationError
from pgqueue.claiming import CLAIM_MODES, default_worker_id
from pgqueue.settings import DEFAULT_LEASE_SECONDS, DEFAULT_QUEUE
from pgqueue_worker.claim_policy import ClaimPolicy
from pgqueue_worker.claims import Claimer, ClaimResult
from pgqueue_worker.executor import Executor
from pgqueue_worker.handlers import HandlerLike, as_task_handlers
from pgqueue_worker.handover import Handover
from pgqueue_worker.helpers import Helpers
from pgqueue_worker.in_flight import InFlightAttempts
from pgqueue_worker.metrics import WorkerMetrics
from pgqueue_worker.outage import DatabaseHealth, discard_broken_connections, why_unavailable
from pgqueue_worker.outcomes import OutcomeWriter
from pgqueue_worker.pruner import DEFAULT_PRUNE_INTERVAL, Retention
from pgqueue_worker.scheduler import ScheduleSync
from pgqueue_worker.slots import SlotKind

log = logging.getLogger("pgqueue.worker")

DEFAULT_CONCURRENCY = 32
# Coroutine handlers hold no thread while they await, so they get slots of their own,
# many more. A worker process runs at most about 10k short async jobs/s, and at most
# slots / await time: 1,000 slots keep handlers that await up to about 0.1 s near that
# ceiling, without one worker holding far more leases than it can use (docs/design.md,
# "Async handlers have slots of their own", has the measurements).
DEFAULT_ASYNC_CONCURRENCY = 1000
# Jobs claimed ahead of free slots, at most (see SlotKind.claim_limit).
DEFAULT_PREFETCH = 512
DEFAULT_POLL_INTERVAL = 1.0
DEFAULT_REAP_INTERVAL = 5.0
DEFAULT_SHUTDOWN_TIMEOUT = 30.0
# Even with nothing to wait for, look around this often (a cheap safety net).
MAX_SLEEP_SECONDS = 60.0
# How long a burst worker waits before it tries again to reap when another holds the lock.
BURST_REAP_RECHECK_SECONDS = 0.1


class Worker:
    """Runs the handlers of ``handlers`` on jobs claimed from ``queue``.

    ``handlers`` maps task names to callables (or :class:`~pgqueue.TaskHandler`), and
    the worker claims only those tasks. Lifecycle hooks are the queue's: build it with
    ``Queue(..., hooks=LifecycleHooks(pm))`` to run plugins' hooks.

    At most ``concurrency`` plain (``def``) handlers run at once, each on a thread of
    its own, and at most ``async_concurrency`` coroutine (``async def``) handlers, on
    one event loop. Each kind is claimed for separately, only its own tasks and only
    as many as its own slots have room for, so that a queue full of one kind never
    keeps the other's slots idle. While handlers are short, the worker also claims up
    to ``prefetch`` jobs of each kind ahead of its free slots (see
    :meth:`~pgqueue_worker.slots.SlotKind.claim_limit`); ``prefetch=0`` claims only for free slots.

    ``run()`` blocks until :meth:`stop` is called (from any thread, or a signal
    handler), or, with ``burst=True``, until no job it could claim is runnable. Jobs
    already claimed ahead still run before it returns.

    ``schedules`` (a :class:`~pgqueue_worker.scheduler.ScheduleSync`) is synced to the
    database once it starts; with ``scheduler=True`` (as ``pgqueue worker`` runs it,
    unless ``--no-scheduler`` or ``--burst``) it also takes its turns enqueueing due
    schedules (see :mod:`pgqueue_worker.scheduler`).
    """

    def __init__(
        self,
        queue: Queue,
        handlers: Mapping[str, HandlerLike],
        *,
        queues: Collection[str] = (DEFAULT_QUEUE,),
        concurrency: int = DEFAULT_CONCURRENCY,
        async_concurrency: int = DEFAULT_ASYNC_CONCURRENCY,
        prefetch: int = DEFAULT_PREFETCH,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        heartbeat_seconds: float | None = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        listen: bool = True,
        reap_interval: float = DEFAULT_REAP_INTERVAL,
        claim_mode: str = "skip-locked",
        burst: bool = False,
        give_up_after: float | None = None,
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
        worker_id: str | None = None,
        retention: Retention | None = None,
        prune_interval: float = DEFAULT_PRUNE_INTERVAL,
        metrics: WorkerMetrics | None = None,
        schedules: ScheduleSync | None = None,
        scheduler: bool = False,
    ) -> None:
        self.queue = queue
        self.handlers: dict[str, TaskHandler] = as_task_handlers(handlers)
        if not self.handlers:
            raise ValidationError("handlers", "a worker needs at least one task handler")
        self.tasks = sorted(self.handlers)
        # A lone string is one queue, not a collection of one-letter queue names.
        self.queues = sorted({queues} if isinstance(queues, str) else set(queues))
        if not self.queues:
            raise ValidationError("queues", "a worker serves at least one queue")
        if concurrency < 1:
            raise ValidationError("concurrency", "must be at least 1")
        if async_concurrency < 1:
            raise ValidationError("async_concurrency", "must be at least 1")
        if prefetch < 0:
            raise ValidationError("prefetch", "must not be negative (0 turns it off)")
        _positive("lease_seconds", lease_seconds)
        heartbeat_seconds = lease_seconds / 3 if heartbeat_seconds is None else heartbeat_seconds
        _positive("heartbeat_seconds", heartbeat_seconds)
        if heartbeat_seconds >= lease_seconds:
            raise ValidationError("heartbeat_seconds", "must be shorter than lease_seconds")
        _positive("poll_interval", poll_interval)
        _positive("reap_interval", reap_interval)
        if claim_mode not in CLAIM_MODES:
            raise ValidationError("claim_mode", f"must be one of {', '.join(CLAIM_MODES)}")
        if shutdown_timeout < 0:
            raise ValidationError("shutdown_timeout", "must not be negative")
        if give_up_after is not None:
            _positive("give_up_after", give_up_after)
        if prune_interval < 0:
            raise ValidationError("prune_interval", "must not be negative (0 turns pruning off)")
        self.concurrency = concurrency
        self.async_concurrency = async_concurrency
        self.prefetch = prefetch
        self.lease_seconds = lease_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.poll_interval = poll_interval
        self.listen = listen
        self.reap_interval = reap_interval
        self.claim_mode = claim_mode
        self.burst = burst
        self.give_up_after = give_up_after
        """Seconds the database may stay unavailable before :meth:`run` stops, as on
        :meth:`stop`, and raises DatabaseUnavailable; None waits however long it takes."""
        self._gave_up: str | None = None
        self.shutdown_timeout = shutdown_timeout
        self.worker_id = worker_id or default_worker_id()
        # None (the library default) prunes nothing; `pgqueue worker` passes its flags'
        # retention, and a prune_interval of 0 turns the pruner off.
        self.retention = retention
        self.prune_interval = prune_interval
        self.schedules = schedules
        self.scheduler = scheduler and not burst
        self.counts: Counter[str] = Counter()
        """What this worker did: succeeded, failed, timed_out, lost (outcomes discarded),
        and database_errors (claim-loop rounds the database refused)."""

        # Inspecting a handler costs more than running a no-op job.
        is_async = {name: h.is_async for name, h in self.handlers.items()}
        # The kinds of slot this worker's handlers need, each claimed for on its own.
        plain = SlotKind("plain", [t for t in self.tasks if not is_async[t]], concurrency)
        coroutines = SlotKind("async", [t for t in self.tasks if is_async[t]], async_concurrency)
        self._claim_policy = ClaimPolicy(
            [kind for kind in (plain, coroutines) if kind.tasks],
            prefetch=prefetch,
            poll_interval=poll_interval,
            burst=burst,
        )
        # By is_async, for the per-job bookkeeping.
        self._kind_of = (plain, coroutines)

        # Handed over from other threads; everything else is the claim loop's own.
        self._handover = Handover(self._claim_policy, metrics)
        self._stop_requested = False

        self._health = DatabaseHealth(probe=lambda: why_unavailable(self.queue))
        self._in_flight = InFlightAttempts(self.handlers, is_async, self.counts)
        self._busy = 0  # of every kind (each kind counts its own too)
        self._started = False
        self.metrics = metrics
        """This worker's Prometheus metrics, if it keeps them (see
        :mod:`pgqueue_worker.metrics`)."""
        if metrics is not None:
            metrics.watch(self)

    # -- control ------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming, let running handlers finish and their outcomes be written, then
        return from :meth:`run` (after ``shutdown_timeout`` at most). Safe to call from
        any thread and from a signal handler."""
        self._stop_requested = True
        self._handover.wake.set()

    @property
    def running_jobs(self) -> int:
        """Attempts whose handler has not returned yet: those running, and those
        claimed ahead and waiting for a slot."""
        return self._busy

    def run(self) -> bool:
        """Serve jobs until stopped. Returns True when the worker stopped cleanly (every
        claimed job's outcome written or discarded, no handler still running), False
        when the shutdown timeout left jobs to their leases. With ``give_up_after``,
        raises :class:`~pgqueue.DatabaseUnavailable` once the database has been
        unavailable that long (having stopped as :meth:`stop` does)."""
        if self._started:
            raise RuntimeError("a Worker runs once; create a new one")
        self._started = True
        # No statement may hang the worker: one that overruns half a lease has its
        # connection cut off, fails, and is retried like any lost connection, while
        # the leases it would otherwise have kept alive still expire on time.
        self.queue = self.queue.with_statement_timeout(self.lease_seconds / 2)
        helpers = Helpers(
            self,
            handover=self._handover,
            health=self._health,
            leases=self._in_flight.leases,
            kinds=self._claim_policy.kinds,
        )
        helpers.start()
        try:
            clean = self._serve(helpers.executor, helpers.claimer, helpers.writer)
            if self._gave_up is not None:
                raise DatabaseUnavailable(self._gave_up)
            return clean
        finally:
            helpers.stop()

    # -- the claim loop -------------------------------------------------------------

    def _serve(self, executor: Executor, claimer: Claimer, writer: OutcomeWriter) -> bool:
        stop_deadline: float | None = None
        claim_policy = self._claim_policy
        in_flight = self._in_flight
        handover = self._handover
        while True:
            handover.rearm()
            now = time.monotonic()
            self._collect(executor, now)
            if self.give_up_after is not None and not self._stop_requested:
                self._give_up_if_down_too_long(now, self.give_up_after)

            if self._stop_requested:
                if stop_deadline is None:
                    stop_deadline = now + self.shutdown_timeout
                    log.info(
                        "stopping: claiming no more jobs; waiting up to %g s for %d running",
                        self.shutdown_timeout,
                        self._busy,
                    )
                # A claim in progress is waited for: its jobs are this worker's to run.
                if self._busy == 0 and not in_flight.pending and not claim_policy.claiming:
                    log.info("stopped cleanly")
                    return True
                if now >= stop_deadline:
                    running = in_flight.running()
                    log.warning(
                        "shutdown timeout: leaving %d running jobs (%s) to their leases",
                        self._busy,
                        ", ".join(str(a.job.id) for a in running),
                    )
                    # Their outcomes will not be written: tell handlers that look.
                    for attempt in running:
                        attempt.job.mark_cancelled()
                    return False

            if (
                self.burst
                and claim_policy.found_nothing()
                and self._busy == 0
                and not in_flight.pending
                and self._reaped_before_exit()
            ):
                log.info("burst: no runnable job left for this worker; exiting")
                return True

            self._write_and_claim(claimer, writer, now)
            handover.wake.wait(self._sleep_seconds(time.monotonic(), stop_deadline))

    def _give_up_if_down_too_long(self, now: float, give_up_after: float) -> None:
        """Stop, as on :meth:`stop`, once the database has been unavailable for
        ``give_up_after`` seconds; :meth:`run` then raises."""
        down_for = self._health.down_for(now)
        if down_for < give_up_after:
            return
        cause = (self._health.cause or "database unavailable").removeprefix(
            "database unavailable: "
        )
        self._gave_up = f"database unavailable for {down_for:.0f} s, giving up: {cause}"
        self._stop_requested = True

    def _collect(self, executor: Executor, now: float) -> None:
        """Take in claimed jobs, finished handlers, leases the heartbeat found lost, and
        timeouts."""
        handover = self._handover
        while True:
            try:
                claim = handover.claims.get_nowait()
            except queue_module.Empty:
                break
            self._take_in_claim(executor, claim)

        in_flight = self._in_flight
        returned = in_flight.returned
        take_finished = handover.finished.get_nowait
        while True:
            try:
                attempt, result, error = take_finished()
            except queue_module.Empty:
                break
            self._busy -= 1
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

        in_flight.time_out(now, executor)

    def _reaped_before_exit(self) -> bool:
        """Before a burst worker concludes that nothing is left, it reaps: a job whose
        worker died is still ``running`` until its expired lease is reaped, and would
        otherwise be left behind by a burst that found "nothing to do". True when
        nothing was left to reap; otherwise the worker looks for jobs once more (a
        reaped job is due again after its backoff, like any failed attempt).

        Reaping is schema-wide, as the reaper thread's is (see ``Reaper``)."""
        try:
            reaped = self.queue.reap()
        except DatabaseUnavailable as exc:
            self.counts["database_errors"] += 1
            self._health.failed("burst reap", exc)
            discard_broken_connections(self.queue)
            reaped = None
            self._claim_policy.back_off()
        if reaped == []:
            return True
        if reaped is None:
            # Another worker holds the reaper lock, reaping right now: look again shortly.
            self._claim_policy.recheck_after(BURST_REAP_RECHECK_SECONDS)
        else:
            log.info(
                "burst: reaped %d jobs whose lease expired: %s",
                len(reaped),
                ", ".join(f"{job.id} ({job.state.value})" for job in reaped[:20]),
            )
        self._claim_policy.look_again()
        return False

    def _write_and_claim(self, claimer: Claimer, writer: OutcomeWriter, now: float) -> None:
        """Hand the outcomes waiting to be written to the writer and, with room and
        reason to, ask the claimer for more jobs."""
        if self._in_flight.unsent:
            writer.submit(self._in_flight.take_unsent())
        claim = self._claim_policy.next_claim(
            now, stopping=self._stop_requested, idle=self._busy == 0
        )
        if claim is not None:
            kind, limit = claim
            claimer.request(limit, kind.tasks)

    def _take_in_claim(self, executor: Executor, claim: ClaimResult) -> None:
        """Start the jobs of a claim, and work out when to claim again."""
        kind = self._claim_policy.claim_returned()
        error = claim.error
        if error is not None:
            if isinstance(error, DatabaseUnavailable):
                self.counts["database_errors"] += 1
                self._health.failed("claim loop", error)
                discard_broken_connections(self.queue)
            else:
                log.error("claim loop error; retrying with backoff", exc_info=error)
            self._claim_policy.claim_failed(kind)
            return
        self._health.succeeded()
        jobs = claim.jobs
        attempts = self._in_flight.open(jobs)
        self._busy += len(attempts)
        kind.started(len(attempts))
        executor.submit_many(attempts)
        self._claim_policy.claimed(
            kind, len(jobs), claim.limit, claim.next_run_seconds, idle=self._busy == 0
        )

    def _sleep_seconds(self, now: float, stop_deadline: float | None) -> float:
        """How long the claim loop may sleep before something needs it (other threads,
        the claimer among them, wake it earlier through the wake signal)."""
        if (
            self._stop_requested
            and self._busy == 0
            and not self._in_flight.pending
            and not self._claim_policy.claiming
        ):
            return 0.0  # the last outcome is written: time to go
        wake_at = min(
            now + MAX_SLEEP_SECONDS,
            self._claim_policy.next_claim_at() if stop_deadline is None else stop_deadline,
            self._in_flight.next_deadline(),
        )
        return max(0.0, wake_at - now)


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValidationError(name, "must be a positive number of seconds")
