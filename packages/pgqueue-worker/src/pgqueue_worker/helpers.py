"""The threads that work around a worker's claim loop, started and stopped together.

The claimer and the outcome writer run the claim loop's statements; the heartbeat
extends its leases and renews its row in the worker registry; the reaper puts expired
leases back; the day maker creates the history's coming days; the pruner, the scheduler
and the listener run as the worker's settings ask. Each calls back into the claim loop
through its :class:`~pgqueue_worker.handover.Handover`.
"""

from __future__ import annotations

import logging
from contextlib import suppress
from typing import TYPE_CHECKING

from pgqueue import WorkerProtocol
from pgqueue.settings import notify_channel
from pgqueue_worker import connections
from pgqueue_worker.claims import Claimer
from pgqueue_worker.day_maker import DayMaker
from pgqueue_worker.executor import Attempt, Executor
from pgqueue_worker.handover import Handover
from pgqueue_worker.heartbeat import Heartbeat
from pgqueue_worker.leases import LeaseSet
from pgqueue_worker.lending import HandlerConnections
from pgqueue_worker.outage import DatabaseHealth
from pgqueue_worker.outcomes import OutcomeWriter
from pgqueue_worker.pruner import Pruner
from pgqueue_worker.reaper import Reaper
from pgqueue_worker.registration import deregister, register, registration
from pgqueue_worker.scheduler import Scheduler
from pgqueue_worker.service import StoppableThread
from pgqueue_worker.slots import SlotKind
from pgqueue_worker.wakeup import Listener

if TYPE_CHECKING:
    from pgqueue_worker.worker import Worker

log = logging.getLogger("pgqueue.worker")

# How long the helper threads get to finish their current round when the worker stops.
HELPER_STOP_SECONDS = 5.0


class Helpers:
    """The handlers' slots (:attr:`executor`) and the helper threads of ``worker``,
    built from its settings; building them enters the worker in the registry.

    :meth:`start` says what the worker serves and how, syncs its schedules, then
    starts every thread; :meth:`stop` stops them and takes the worker out of the
    registry. ``kinds`` are the worker's kinds of handler slot.
    """

    def __init__(
        self,
        worker: Worker,
        protocol: WorkerProtocol,
        *,
        handover: Handover,
        health: DatabaseHealth,
        leases: LeaseSet,
        kinds: list[SlotKind],
    ) -> None:
        queue = worker.queue
        metrics = worker.metrics
        self._worker = worker
        self._kinds = kinds
        self._queue = queue
        self._protocol = protocol
        self._health = health
        self.executor = Executor(
            worker.concurrency,
            handover.handler_finished,
            handover.handler_started,
            on_running=self._handler_running,
            async_size=worker.async_concurrency,
        )
        # Connections for handlers' job.transaction() and job.atransaction(), one per
        # handler slot at most, opened when a handler first asks (see lending.py).
        self.lender = HandlerConnections(
            queue,
            size=worker.concurrency,
            async_size=min(worker.async_concurrency, worker.concurrency),
        )
        protocol.lender = self.lender
        self.writer = OutcomeWriter(
            protocol,
            health=health,
            on_written=handover.outcomes_written,
            on_statement=None if metrics is None else metrics.outcomes_written,
        )
        self.claimer = Claimer(
            protocol,
            worker.queues,
            worker.tasks,
            lease_seconds=worker.lease_seconds,
            worker_id=worker.worker_id,
            mode=worker.claim_mode,
            on_claimed=handover.claimed,
            on_written=handover.outcomes_written,
            # Recorded as waiting for a little over two polls: each poll's claim renews it.
            waiter_seconds=2 * worker.poll_interval + 1.0 if worker.listen else None,
        )
        # The heartbeat's statements too: a stuck one is cut off while a retry can
        # still extend the leases before they expire.
        self._heartbeat_queue = connections.sibling_queue(
            queue, connections.HEARTBEAT
        ).with_statement_timeout(queue.statement_timeout)
        # In the worker registry from start to stop, renewed by the heartbeat.
        self._me = registration(
            worker.worker_id,
            worker.queues,
            worker.tasks,
            concurrency=sum(kind.size for kind in kinds),
            heartbeat_seconds=worker.heartbeat_seconds,
        )
        register(queue, self._me)
        heartbeat = Heartbeat(
            WorkerProtocol(self._heartbeat_queue),
            leases,
            interval=worker.heartbeat_seconds,
            lease_seconds=worker.lease_seconds,
            health=health,
            on_lost=handover.leases_lost,
            on_beat=None if metrics is None else metrics.heartbeat_written,
            worker=self._me,
        )
        reaper = Reaper(protocol, interval=worker.reap_interval, health=health)
        # Whatever the retention: days are made even when nothing is ever pruned.
        day_maker = DayMaker(queue, health=health)
        self._pruner = None
        retention = worker.retention
        if retention is not None and retention.rules() and worker.prune_interval > 0:
            self._pruner = Pruner(queue, retention, interval=worker.prune_interval, health=health)
        self._scheduler = None
        if worker.schedules is not None or worker.scheduler:
            self._scheduler = Scheduler(
                queue, health=health, sync=worker.schedules, run=worker.scheduler
            )
        listener = None
        if worker.listen:
            listener = Listener(
                protocol,
                worker.queues,
                connect=lambda: connections.dedicated_connection(queue, connections.LISTEN),
                wake=handover.notified,
                poll_interval=worker.poll_interval,
            )
        # In the order they start, after the claimer and the writer.
        services: tuple[StoppableThread | None, ...] = (
            heartbeat,
            reaper,
            day_maker,
            self._pruner,
            self._scheduler,
            listener,
        )
        self._services = [service for service in services if service is not None]

    def start(self) -> None:
        """Say what the worker serves and how, sync the schedules, then start the slots
        and every helper thread."""
        self._log_start()
        if self._scheduler is not None:
            if self._scheduler.run:
                log.info("scheduler on: enqueueing due schedules, one worker at a time")
            self._scheduler.sync_now()
        if self._pruner is not None:
            log.info(
                "pruning finished jobs of every queue every %g s (one worker at a time): %s",
                self._pruner.interval,
                self._pruner.retention.describe(),
            )
        self.executor.start()
        self.claimer.start()
        self.writer.start()
        for service in self._services:
            service.start()

    def stop(self) -> None:
        """Stop the helper threads, then the slots, giving each thread up to
        HELPER_STOP_SECONDS to finish its round; the worker leaves the registry."""
        helpers: list[StoppableThread | Claimer | OutcomeWriter] = [
            *reversed(self._services),
            self.claimer,
            self.writer,
        ]
        # Tell them all first, then wait: one stuck in a call to a dead server must
        # not hold up the others' stopping.
        for helper in helpers:
            helper.stop(timeout=0)
        for helper in helpers:
            helper.stop(HELPER_STOP_SECONDS)
        # Enqueues need not notify for this worker any more. Best effort, and not
        # tried while the database is down: the records expire anyway.
        if not self._health.down:
            with suppress(Exception):
                self._protocol.forget_waiters(self.claimer.waiters.values())
            deregister(self._queue, self._me)
        # Before the slots' event loop stops: the asyncio pool closes on it.
        self.lender.close()
        self.executor.shutdown()
        self._heartbeat_queue.pool.close(timeout=HELPER_STOP_SECONDS)

    def _handler_running(self, attempt: Attempt) -> None:
        """On the handler's own thread, just before it is called: ``on_start``. Not when
        the job is claimed: a job claimed ahead may wait for a slot, and one called off
        while it waits never starts."""
        hooks = self._queue.hooks
        if hooks is not None:
            hooks.call("on_start", job=attempt.job)

    def _log_start(self) -> None:
        worker = self._worker
        wakeup = (
            f"LISTEN on {notify_channel(self._queue.schema)} and polling every "
            f"{worker.poll_interval:g} s"
            if worker.listen
            else f"polling every {worker.poll_interval:g} s"
        )
        log.info(
            "worker %s serving queue%s %s with task%s %s: %s, %g s leases "
            "(heartbeat every %g s), %s",
            worker.worker_id,
            "s" if len(worker.queues) > 1 else "",
            ", ".join(worker.queues),
            "s" if len(worker.tasks) > 1 else "",
            ", ".join(worker.tasks),
            " and ".join(kind.describe() for kind in self._kinds),
            worker.lease_seconds,
            worker.heartbeat_seconds,
            wakeup,
        )
