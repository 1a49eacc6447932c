"""Enqueueing from asyncio code, part of what a :class:`pgqueue.Queue` offers a producer.

An async web application that calls ``Queue.enqueue`` must hand each call to a thread,
and that hop (waking a thread, waking the event loop again when it is done) costs a
request more CPU than the enqueue's own Python does. :class:`AsyncProducer` runs the
enqueue an application makes once per request, a job without an idempotency key, a
unique key or dependencies, as one statement on a connection of an
``AsyncConnectionPool``, on the event loop itself: the same ``job_insert`` statement,
the same validation and the same job back as ``Queue.enqueue``.

Every other enqueue (a key or dependencies, which take several statements whose code
is synchronous) runs ``Queue.enqueue_spec`` in a thread, as before; so does every
enqueue of a Queue with a ``statement_timeout``, whose watchdog guards synchronous
connections only.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg_pool

from pgqueue import connections, queries, tracing, validation
from pgqueue.errors import DatabaseUnavailable, ValidationError
from pgqueue.job import EnqueueResult, Job
from pgqueue.job_spec import JobSpec
from pgqueue.queue_base import UNAVAILABLE, describe_unavailable

if TYPE_CHECKING:
    from pgqueue.queue import Queue


class AsyncProducer:
    """``enqueue`` for asyncio code, beside ``queue``: single keyless jobs on ``pool`` (an
    open ``psycopg_pool.AsyncConnectionPool`` to the same database), everything else
    through ``queue`` in a thread. :meth:`open` makes both from a Queue."""

    def __init__(self, queue: Queue, pool: psycopg_pool.AsyncConnectionPool) -> None:
        self.queue = queue
        self.pool = pool

    @classmethod
    async def open(
        cls, queue: Queue, *, max_size: int = 10, pool_timeout: float | None = None
    ) -> AsyncProducer:
        """An AsyncProducer for ``queue``, with a pool of up to ``max_size`` connections
        made as ``queue``'s own are (its conninfo, its connection settings, prepared
        statements or not). Opening does not wait for the database: while it is down,
        enqueues raise :class:`~pgqueue.errors.DatabaseUnavailable`."""
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
            raise ValidationError("max_size", "must be an integer of at least 1")
        pool = connections.async_sibling_pool(
            queue.pool,
            name="pgqueue-async",
            max_size=max_size,
            timeout=queue.pool.timeout if pool_timeout is None else pool_timeout,
        )
        await pool.open(wait=False)
        return cls(queue, pool)

    async def close(self) -> None:
        """Close the async pool (``queue`` is its owner's to close)."""
        await self.pool.close()

    async def enqueue(
        self, task: str, payload: dict[str, Any] | None = None, **options: Any
    ) -> EnqueueResult:
        """:meth:`pgqueue.Queue.enqueue`, awaited, with the same keyword arguments (queue,
        priority, delay_seconds, run_at, idempotency_key, max_attempts, timeout_seconds,
        unique_key, depends_on, dependency_mode, tags, partition_key) but ``conn``: inside a transaction of
        your own, use ``Queue.enqueue(conn=...)``."""
        return await self.enqueue_spec(JobSpec(task, {} if payload is None else payload, **options))

    async def enqueue_spec(self, spec: JobSpec) -> EnqueueResult:
        """:meth:`enqueue` of the job ``spec`` describes."""
        if not spec.single_statement or self.queue.statement_timeout is not None:
            return await asyncio.to_thread(self.queue.enqueue_spec, spec)
        params = spec.params()
        validation.within_limit("payload", params["payload"], self.queue.max_payload_bytes)
        if tracing.enabled():
            with tracing.sending([spec.queue], [spec.task]) as sent:
                params["trace_context"] = sent.trace_context
                job_id, run_at, enqueued_at = await self._insert_one(params)
                sent.created([job_id])
        else:
            job_id, run_at, enqueued_at = await self._insert_one(params)
        return EnqueueResult(spec.queued_job(job_id, run_at, enqueued_at), True)

    async def wait(self, job_id: int, timeout: float) -> Job:
        """:meth:`pgqueue.Queue.wait`, awaited: the job once it is final, or as it is
        when ``timeout`` seconds have passed. The wait holds no thread and no
        connection (the Queue's job watcher wakes it); the job is read in a thread."""
        timeout = validation.seconds("timeout", timeout)
        deadline = time.monotonic() + timeout
        watcher = self.queue.job_watcher()
        while True:
            woken = await watcher.wait_async(job_id, deadline - time.monotonic())
            job = await asyncio.to_thread(self.queue.get, job_id)
            if job.state.finished or not woken or time.monotonic() >= deadline:
                return job

    async def _insert_one(self, params: dict[str, Any]) -> tuple[int, datetime, datetime]:
        """Run job_insert in autocommit, its own transaction: the id and the times."""
        try:
            async with self.pool.connection() as conn:
                cur = conn.cursor()
                await cur.execute(queries.bind("job_insert", self.queue.schema), params)
                row = await cur.fetchone()
        except UNAVAILABLE as exc:
            raise DatabaseUnavailable(describe_unavailable(exc)) from exc
        assert row is not None  # an INSERT ... RETURNING of one row
        return row[0], row[1], row[2]
