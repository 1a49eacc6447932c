"""The worker's side of a queue schema: :class:`WorkerProtocol`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any

from pgqueue.claiming import ClaimMethods, Waiter, _claim_params
from pgqueue.job import Job, Lease
from pgqueue.outcomes import OutcomeBatch, OutcomeMethods, _outcome_rows
from pgqueue.queue_base import send_commit
from pgqueue.settings import DEFAULT_LEASE_SECONDS

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
        # Its statements give back the connections the Queue's producers keep.
        self._producer_connections = queue._producer_connections
        self.lender = None
        """Lends ``job.transaction()`` and ``job.atransaction()`` of the jobs claimed
        through this protocol their connection: the worker running them sets it (see
        :class:`pgqueue.effects.ConnectionLender`)."""
        self._queues_with_settings = {}
        """Per list of queues claimed together, whether one of them had settings at the
        last claim (see ClaimMethods._send_claim)."""
        self._unwritten_refusals = []
        """Failed attempts of claimed jobs whose payload could not be decoded, not
        written yet (see ClaimMethods._refuse_undecodable)."""

    def write_progress(self, reports: Iterable[tuple[Lease, float, str | None]]) -> list[int]:
        """Record the progress of running attempts, each ``(lease, fraction, message)``,
        in one statement (see :meth:`pgqueue.Job.progress`); return the ids written. A
        lease that was lost writes nothing, and neither does a job whose row another
        transaction holds right now (it never waits: write it again later)."""
        reports = list(reports)
        if not reports:
            return []
        rows = self._rows(
            "job_progress_write",
            {
                "ids": [lease.job_id for lease, _, _ in reports],
                "tokens": [lease.token for lease, _, _ in reports],
                "fractions": [fraction for _, fraction, _ in reports],
                "messages": [message for _, _, message in reports],
            },
        )
        return [row["id"] for row in rows]

    def ack_and_claim(
        self,
        successes: Iterable[tuple[Job, Any]],
        queues: Collection[str],
        tasks: Collection[str],
        limit: int = 1,
        *,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        worker_id: str | None = None,
        mode: str = "skip-locked",
        waiter: Waiter | None = None,
    ) -> AckedClaim:
        """Acknowledge ``successes`` (each a ``(job, result)``, as :meth:`ack_many`) and
        claim up to ``limit`` jobs (as :meth:`claim`) in one transaction: one round trip
        and one commit, where the two calls take two of each. A worker that has nothing
        running waits for its next job's claim anyway; its finished jobs' acks can ride
        along instead of costing a commit of their own.

        Both happen, or neither (the caller then still holds the leases, and writes the
        acks again). The acks' lifecycle hooks (``on_success``, or ``on_fail`` for a
        result that could not be stored) run when the caller settles them with
        :meth:`AckedClaim.settle`, so that it can start the claimed jobs first. Once
        the transaction has committed, nothing that follows in this call (see
        :meth:`claim`) can fail it: the claimed jobs and the acks' settlement always
        reach the caller.

        A result that cannot be stored makes its attempt a failed one, which may have
        dependents to cancel before the commit: such a batch is written first, then the
        claim is sent with the commit, still in one transaction.
        """
        rows = _outcome_rows(successes, (), self.max_result_bytes)
        params = _claim_params(queues, tasks, limit, lease_seconds, worker_id, mode, waiter)
        if params is None:
            # Nothing to claim: the acks alone.
            if not rows:
                return AckedClaim([], functools.partial(OutcomeBatch, [], [], []))
            with self._connection() as conn:
                written, ended = self._write_outcomes(conn, rows, commit=True)
            return AckedClaim([], functools.partial(self._settle, rows, written, ended))
        plain = self._claims_plainly(params)
        if not rows:
            claimed = self._claimed(params, mode, plain, self._claim_once(params, mode))
            return AckedClaim(claimed, functools.partial(OutcomeBatch, [], [], []))
        with self._connection() as conn:
            cancelled: list[Job] = []
            if any(row.error is not None for row in rows):
                # The dependents of an attempt that ended dead are cancelled from what
                # the write returned, before the commit: the write goes first.
                written, cancelled = self._write_outcomes(conn, rows, commit=False)
                with conn.pipeline():
                    read_claim = self._send_claim(conn, params, mode)
                    send_commit(conn)
            else:
                # One pipeline, the COMMIT in it: a worker cut off after sending never
                # leaves its transaction open, holding the rows (see _write_outcomes).
                with conn.pipeline():
                    read_outcomes = self._send_outcomes(conn, rows)
                    read_claim = self._send_claim(conn, params, mode)
                    send_commit(conn)
                written = read_outcomes()
            claimed = read_claim()
        settle = functools.partial(self._settle, rows, written, cancelled)
        return AckedClaim(self._claimed(params, mode, plain, claimed), settle)


class AckedClaim:
    """What :meth:`WorkerProtocol.ack_and_claim` committed: the jobs it claimed, and the
    acks, which :meth:`settle` reports."""

    __slots__ = ("_batch", "_settle", "jobs")

    def __init__(self, jobs: list[Job], settle: Callable[[], OutcomeBatch]) -> None:
        self.jobs = jobs
        """The jobs claimed, each under a fresh lease, in claim order."""
        self._settle = settle
        self._batch: OutcomeBatch | None = None

    def settle(self) -> OutcomeBatch:
        """What the acks wrote (succeeded, failed, or refused for a lost lease), their
        hooks run on the first call, in the calling thread."""
        if self._batch is None:
            self._batch = self._settle()
        return self._batch
