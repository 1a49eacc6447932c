"""The worker's side of a queue schema: :class:`WorkerProtocol`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pgqueue.claiming import ClaimMethods
from pgqueue.outcomes import OutcomeMethods

if TYPE_CHECKING:
    from pgqueue.queue import Queue


class WorkerProtocol(ClaimMethods, OutcomeMethods):
    """What a worker does to the jobs of one queue schema: claim them under leases
    (:meth:`claim`), keep the leases alive (:meth:`heartbeat`), write what became of
    each attempt (:meth:`ack`, :meth:`fail`, and :meth:`finish_many` for a batch of
    both in one statement), return the jobs of workers that stopped heartbeating
    (:meth:`reap`), and wait for new ones (:meth:`listen`, :meth:`next_run_in`).

    Made from a :class:`~pgqueue.Queue`, whose pool, schema, lifecycle hooks, retry
    backoff and limits it shares: ``WorkerProtocol(queue)``. ``pgqueue worker`` runs
    on one; so may a loop of your own, or a test. Producers and operators use the
    Queue itself, which has none of these calls.
    """

    def __init__(self, queue: Queue) -> None:
        self.pool = queue.pool
        self.schema = queue.schema
        self.hooks = queue.hooks
        self.retry_base = queue.retry_base
        self.retry_cap = queue.retry_cap
        self.max_payload_bytes = queue.max_payload_bytes
        self.max_result_bytes = queue.max_result_bytes
        self.statement_timeout = queue.statement_timeout
        self._queues_with_settings = {}
        """Per list of queues claimed together, whether one of them had settings at the
        last claim (see ClaimMethods._send_claim)."""
