"""Enqueueing, part of :class:`pgqueue.Queue`: one job or many, in a transaction of the
caller's or in one of its own, with idempotency keys, unique keys and dependencies
handed to :mod:`pgqueue.keyed` and :mod:`pgqueue.dependencies`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime
from typing import Any

import psycopg
import psycopg.errors

from pgqueue import bulk, dependencies, jsonb, keyed, tracing, validation
from pgqueue.errors import DatabaseUnavailable, IdempotencyConflict
from pgqueue.job import EnqueueResult
from pgqueue.job_spec import JobSpec
from pgqueue.producer_connections import Borrowed
from pgqueue.queue_base import UNAVAILABLE, QueueBase, describe_unavailable
from pgqueue.settings import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE


class ProducerMethods(QueueBase):
    """``enqueue`` and ``enqueue_many``: the part of :class:`pgqueue.Queue` a producer
    calls."""

    def enqueue(
        self,
        task: str,
        payload: dict[str, Any] | None = None,
        *,
        queue: str = DEFAULT_QUEUE,
        priority: int = 0,
        delay_seconds: float | None = None,
        run_at: datetime | None = None,
        idempotency_key: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout_seconds: float | None = None,
        unique_key: str | None = None,
        depends_on: Sequence[int] = (),
        tags: Sequence[str] = (),
        conn: psycopg.Connection | None = None,
        dependency_mode: str = "succeeded",
        partition_key: str | None = None,
    ) -> EnqueueResult:
        """Add one job; with an ``idempotency_key`` already in the table, return that job
        (``created=False``) if it has the same task, queue and payload, and raise
        :class:`~pgqueue.errors.IdempotencyConflict` if not.

        With a ``unique_key`` that a queued or running job holds, return that job
        (``created=False``), whatever its task, queue and payload; once it has finished,
        the key is free again. See :mod:`pgqueue.keyed` for both keys on one job.

        With ``depends_on`` (job ids), the job waits until those jobs have succeeded, and
        is cancelled if one ends dead or cancelled (see :mod:`pgqueue.dependencies`);
        ids that are no job raise :class:`~pgqueue.errors.UnknownDependencies`. With
        ``dependency_mode="finished"`` it waits until they are all final in any state
        (succeeded, dead or cancelled) and is never cancelled by them: a callback for a
        group. Its handler finds them, with their states and results, in
        ``job.dependencies``.

        ``tags`` (at most 16 strings of 1 to 64 characters) label the job, to find it by
        with :meth:`~pgqueue.Queue.list`.

        ``partition_key`` (1 to 200 characters) names the tenant, customer or account
        the job is for: claims take jobs round-robin across keys, so that one key's
        backlog does not hold up the others, and the queue's partition limits
        (:meth:`~pgqueue.Queue.update_queue`) hold per key.

        Pass ``conn`` to enqueue inside your own transaction: the job then commits or
        rolls back with your writes, and workers are woken when you commit.
        """
        spec = JobSpec(
            task=task,
            payload={} if payload is None else payload,
            queue=queue,
            priority=priority,
            delay_seconds=delay_seconds,
            run_at=run_at,
            idempotency_key=idempotency_key,
            max_attempts=max_attempts,
            timeout_seconds=timeout_seconds,
            unique_key=unique_key,
            depends_on=depends_on,
            dependency_mode=dependency_mode,
            tags=tags,
            partition_key=partition_key,
        )
        return self.enqueue_spec(spec, conn=conn)

    def enqueue_spec(
        self, spec: JobSpec, *, conn: psycopg.Connection | None = None
    ) -> EnqueueResult:
        """:meth:`enqueue` of the job ``spec`` describes (for a caller that has already
        built one, such as the HTTP API)."""
        if not spec.single_statement:
            return self.enqueue_many([spec], conn=conn)[0]
        params = spec.params()
        validation.within_limit("payload", params["payload"], self.max_payload_bytes)
        if tracing.enabled():
            with tracing.sending([spec.queue], [spec.task]) as sent:
                params["trace_context"] = sent.trace_context
                job_id, run_at, enqueued_at = self._insert_one(params, conn)
                sent.created([job_id])
            traced = tracing.loaded_trace_context(sent.trace_context)
            job = spec.queued_job(job_id, run_at, enqueued_at, trace_context=traced)
        else:
            job_id, run_at, enqueued_at = self._insert_one(params, conn)
            job = spec.queued_job(job_id, run_at, enqueued_at)
        return EnqueueResult(job, True)

    def _insert_one(
        self, params: dict[str, Any], conn: psycopg.Connection | None
    ) -> tuple[int, datetime, datetime]:
        """Run job_insert for one job's ``params``: what the server decided, the id and
        the times."""
        try:
            with nullcontext(conn) if conn is not None else self._autocommit() as c:
                # No jsonb comes back, so a plain cursor: one with loaders of its own (as
                # jsonb.cursor makes) makes psycopg rebuild its adapters, about 40 us of
                # CPU per call, more than all of pgqueue's own Python on this path. Its
                # rows are tuples, the cheapest rows psycopg makes.
                cur = c.cursor()
                cur.execute(self._sql("job_insert"), params)
                row = cur.fetchone()
        except UNAVAILABLE as exc:
            raise DatabaseUnavailable(describe_unavailable(exc)) from exc
        assert row is not None  # an INSERT ... RETURNING of one row
        return row[0], row[1], row[2]

    def _autocommit(self) -> AbstractContextManager[psycopg.Connection]:
        """A pooled connection in autocommit mode, for one statement that is its own
        transaction: in autocommit it costs one round trip, where BEGIN, the statement
        and COMMIT cost more, even pipelined. One that producers keep between enqueues
        when the Queue owns its pool (see :mod:`pgqueue.producer_connections`); the
        caller turns the errors of the database into DatabaseUnavailable."""
        parked = self._producer_connections
        if parked is not None and self.statement_timeout is None:
            return Borrowed(parked)
        return self._switched_to_autocommit()

    @contextmanager
    def _switched_to_autocommit(self) -> Iterator[psycopg.Connection]:
        with self._connection() as c:
            c.autocommit = True
            try:
                yield c
            finally:
                c.autocommit = False

    def enqueue_many(
        self, specs: Iterable[JobSpec], *, conn: psycopg.Connection | None = None
    ) -> list[EnqueueResult]:
        """Add many jobs in one transaction, all or nothing; results follow the input
        order. Large keyless batches go in by COPY (see :mod:`pgqueue.bulk`).

        A payload over ``max_payload_bytes`` raises :class:`~pgqueue.validation.TooLarge`
        (a ValidationError) whose ``index`` is its position in ``specs``; nothing is added.

        Items whose idempotency key already exists (or repeats an earlier item's) return
        the existing job with ``created=False``, provided the job has the same task, queue
        and payload (payloads compared as JSON values). If not, the key names another job
        than the one asked for: :class:`~pgqueue.errors.IdempotencyConflict` is raised
        naming the items and what differs, and nothing is added, also in ``conn``'s
        transaction, which may still commit its other work. Priority, timing, attempts
        and time limit are not compared: a client retrying with other options still
        means the same job.

        Items whose unique key a queued or running job holds (or an earlier item of the
        call) return that job with ``created=False``, not compared (see
        :mod:`pgqueue.keyed`).

        An item's ``depends_on`` may name earlier items of the call by position,
        ``BatchItem(0)`` (see :mod:`pgqueue.dependencies`).
        """
        specs = list(specs)
        if not specs:
            return []
        if tracing.enabled():
            with tracing.sending([s.queue for s in specs], [s.task for s in specs]) as sent:
                results = self._enqueue_many(specs, conn, sent.trace_context)
                sent.created([result.job.id for result in results])
                return results
        return self._enqueue_many(specs, conn, None)

    def _enqueue_many(
        self, specs: list[JobSpec], conn: psycopg.Connection | None, trace_context: str | None
    ) -> list[EnqueueResult]:
        """enqueue_many, with ``trace_context`` (JSON text) stored with every job."""
        # One pass over the batch: its sizes checked, and which path it takes.
        dependent = keyed_items = False
        for index, spec in enumerate(specs):
            try:
                validation.within_limit("payload", spec.payload_text, self.max_payload_bytes)
            except validation.TooLarge as exc:
                exc.index = index
                raise
            dependent = dependent or dependencies.has_dependencies(spec)
            keyed_items = keyed_items or keyed.is_keyed(spec)
        if dependent:
            return self._enqueue_dependent(specs, conn, trace_context)
        if keyed_items:
            return self._enqueue_keyed(specs, conn, trace_context)
        if len(specs) >= bulk.COPY_MIN_JOBS:
            with self._connection(conn) as c, c.transaction() if c.autocommit else nullcontext():
                jobs = bulk.copy_jobs(c, self.schema, specs, trace_context)
            return EnqueueResult.all_created(jobs)
        rows = [spec.params() for spec in specs]
        if trace_context is not None:
            for row in rows:
                row["trace_context"] = trace_context
        columns = {key: [row[key] for row in rows] for key in rows[0]}
        # Without a caller's connection and with no key, so no conflict to check, the
        # one statement is its own transaction, as in enqueue.
        try:
            with nullcontext(conn) if conn is not None else self._autocommit() as c:
                # Tuples of the id and the times, on a plain cursor (see _insert_one).
                cur = c.cursor()
                cur.execute(self._sql("job_insert_many"), columns)
                fetched = cur.fetchall()
        except UNAVAILABLE as exc:
            raise DatabaseUnavailable(describe_unavailable(exc)) from exc
        # Keyless rows always insert, in input order, so their ids follow it.
        fetched.sort()
        payloads = jsonb.load_json_texts([spec.payload_text for spec in specs])
        traced = tracing.loaded_trace_context(trace_context)
        jobs = [
            spec.queued_job(
                job_id, run_at, enqueued_at, loaded_payload=payload, trace_context=traced
            )
            for spec, (job_id, run_at, enqueued_at), payload in zip(
                specs, fetched, payloads, strict=True
            )
        ]
        return EnqueueResult.all_created(jobs)

    def _enqueue_keyed(
        self, specs: list[JobSpec], conn: psycopg.Connection | None, trace_context: str | None
    ) -> list[EnqueueResult]:
        """enqueue_many of specs of which some carry an idempotency or a unique key."""
        with self._connection(conn) as c:
            # An autocommit connection would commit the insert before a conflict is
            # found or a key taken for nothing is released: make the statements one
            # transaction.
            atomic = conn is not None and c.autocommit
            with c.transaction() if atomic else nullcontext():
                cur = jsonb.cursor(c)
                results, conflicts = keyed.insert_keyed(cur, self.schema, specs, trace_context)
                if conflicts:
                    if conn is not None and not atomic:
                        # The caller's transaction: take back what this call added, so
                        # that it adds nothing (no savepoint: in a long transaction,
                        # one per call would overflow the server's subtransaction cache).
                        ids = [r.job.id for r in results if r.created]
                        cur.execute(self._sql("job_delete_created"), {"ids": ids})
                    # Otherwise the transaction is rolled back.
                    raise IdempotencyConflict(conflicts, items=len(specs))
                return results

    def _enqueue_dependent(
        self, specs: list[JobSpec], conn: psycopg.Connection | None, trace_context: str | None
    ) -> list[EnqueueResult]:
        """enqueue_many of specs of which some carry ``depends_on``."""
        dependencies.check_batch_items(specs)
        with self._connection(conn) as c:
            # The caller's transaction, idle or not: the statements join it (never a
            # transaction of their own, nor a savepoint: in a long transaction, one per
            # call would overflow the server's subtransaction cache), and it checks the
            # dependencies as it commits. Otherwise a transaction of this call's own,
            # made explicit on an autocommit connection, which checks them before its
            # commit so as to return the jobs as committed.
            callers = conn is not None and not c.autocommit
            with c.transaction() if conn is not None and c.autocommit else nullcontext():
                cur = jsonb.cursor(c)
                results, conflicts = dependencies.insert_with_dependencies(
                    cur, self.schema, specs, trace_context, check_now=not callers
                )
                if conflicts:
                    if callers:
                        # Take back what this call added, so that it adds nothing; the
                        # jobs are not linked yet. Otherwise the transaction rolls back.
                        ids = [r.job.id for r in results if r.created]
                        cur.execute(self._sql("job_delete_created"), {"ids": ids})
                    raise IdempotencyConflict(conflicts, items=len(specs))
        return results
