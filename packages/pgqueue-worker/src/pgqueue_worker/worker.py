"""The worker: one claim loop feeding N handler slots, with every job under a lease.

:class:`Worker` holds the worker's settings, checked. Its :meth:`~Worker.run` runs the
claim loop (:mod:`pgqueue_worker.claim_loop`), which owns the worker's bookkeeping, and
around it its helpers (:mod:`pgqueue_worker.helpers`), each on a thread of its own: the
claimer, the outcome writer, the heartbeat (one statement per interval extends every
lease this worker holds, on a connection of its own), the reaper (puts expired leases
back, at most one worker at a time), the day maker (creates the history's coming days),
the listener (LISTEN/NOTIFY wake-ups, polling as the fallback), and the pruner and the
scheduler as its settings ask.

Delivery is at least once. An outcome is written only under the lease it was claimed
with, so a worker that lost its lease (cancelled, or reaped after a stall) can never
overwrite what another attempt did. An outcome that cannot be written (the database is
down) is retried until it is, while the lease lasts; if the worker dies first, or the
lease expires, the job runs again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping

from pgqueue import DatabaseUnavailable, Queue, TaskHandler, ValidationError, WorkerProtocol
from pgqueue.claiming import CLAIM_MODES, default_worker_id
from pgqueue.settings import DEFAULT_LEASE_SECONDS, DEFAULT_QUEUE
from pgqueue_worker.claim_loop import ClaimLoop
from pgqueue_worker.handlers import HandlerLike, as_task_handlers
from pgqueue_worker.helpers import Helpers
from pgqueue_worker.metrics import WorkerMetrics
from pgqueue_worker.outage import DatabaseHealth, why_unavailable
from pgqueue_worker.pruner import DEFAULT_PRUNE_INTERVAL, Retention
from pgqueue_worker.scheduler import ScheduleSync

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
        throttled, and database_errors (claim-loop rounds the database refused)."""

        self._started = False
        self.metrics = metrics
        """This worker's Prometheus metrics, if it keeps them (see
        :mod:`pgqueue_worker.metrics`)."""
        self._health = DatabaseHealth(probe=lambda: why_unavailable(self.queue))
        self._loop = ClaimLoop(self, self._health)
        if metrics is not None:
            metrics.watch(self)

    # -- control ------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming, let running handlers finish and their outcomes be written, then
        return from :meth:`run` (after ``shutdown_timeout`` at most). Safe to call from
        any thread and from a signal handler."""
        self._loop.stop()

    @property
    def running_jobs(self) -> int:
        """Attempts whose handler has not returned yet: those running, and those
        claimed ahead and waiting for a slot."""
        return self._loop.busy

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
        protocol = WorkerProtocol(self.queue)
        loop = self._loop
        helpers = Helpers(
            self,
            protocol,
            handover=loop.handover,
            health=self._health,
            leases=loop.in_flight.leases,
            kinds=loop.claim_policy.kinds,
        )
        helpers.start()
        try:
            clean = loop.serve(protocol, helpers.executor, helpers.claimer, helpers.writer)
            if loop.gave_up is not None:
                raise DatabaseUnavailable(loop.gave_up)
            return clean
        finally:
            helpers.stop()


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValidationError(name, "must be a positive number of seconds")
