"""The connections a worker lends its handlers: ``job.transaction()`` and
``job.atransaction()``.

A handler that has no pool of its own completes its job in a transaction on one of
these (see :mod:`pgqueue.effects`). They are pools of their own, beside the worker's
(``pgqueue-worker-handlers``): a handler that holds a connection for as long as its
transaction lasts must never take one that claims, acks and the reaper need. Each pool
opens on first use, so a worker whose handlers never ask opens no connection for them,
and its connections are made as the worker's are (the same conninfo and options: no
server-side prepared statements under ``--no-prepare``), in autocommit mode, so that the
transaction is the ``BEGIN`` ... ``COMMIT`` the handler's block makes of it: one server
transaction, also behind PgBouncer in transaction mode.

The asyncio pool belongs to the event loop of the worker's coroutine handlers (there is
one), where it opens, and is closed there before that loop stops.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
import psycopg_pool

from pgqueue import Queue, connections

HANDLERS = "pgqueue-worker-handlers"
"""The ``application_name`` of the connections lent to handlers."""

CLOSE_SECONDS = 5.0


class HandlerConnections:
    """Lends handlers connections to ``queue``'s database: at most ``size`` at once to
    plain handlers and ``async_size`` to coroutine handlers (a handler that asks for one
    while all are lent waits, up to the pool's timeout, then fails its attempt)."""

    def __init__(self, queue: Queue, *, size: int, async_size: int) -> None:
        self._queue = queue
        self._size = size
        self._async_size = async_size
        self._lock = threading.Lock()
        self._pool: psycopg_pool.ConnectionPool | None = None
        self._async_pool: psycopg_pool.AsyncConnectionPool | None = None
        self._async_loop: asyncio.AbstractEventLoop | None = None
        self._async_opening: asyncio.Lock | None = None
        self._closed = False

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection for the ``with`` block, in autocommit mode."""
        with self._sync_pool().connection() as conn:
            yield conn

    @asynccontextmanager
    async def aconnection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """An asyncio connection for the ``async with`` block, in autocommit mode."""
        pool = await self._opened_async_pool()
        async with pool.connection() as conn:
            yield conn

    def close(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Close the pools: the asyncio one on its event loop, which must still run."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            async_pool, self._async_pool = self._async_pool, None
            async_loop = self._async_loop
        if pool is not None:
            pool.close(timeout=CLOSE_SECONDS)
        if async_pool is not None and async_loop is not None and async_loop.is_running():
            closing = asyncio.run_coroutine_threadsafe(
                async_pool.close(timeout=CLOSE_SECONDS), async_loop
            )
            try:
                closing.result(CLOSE_SECONDS + 1)
            except Exception:  # the process is stopping: its connections go with it
                closing.cancel()

    def _sync_pool(self) -> psycopg_pool.ConnectionPool:
        with self._lock:
            self._refuse_if_closed()
            if self._pool is None:
                self._pool = connections.sibling_pool(
                    self._queue.pool, name=HANDLERS, max_size=self._size, autocommit=True
                )
            return self._pool

    async def _opened_async_pool(self) -> psycopg_pool.AsyncConnectionPool:
        pool = self._async_pool
        if pool is not None:
            return pool
        loop = asyncio.get_running_loop()
        with self._lock:
            self._refuse_if_closed()
            if self._async_opening is None:
                self._async_opening = asyncio.Lock()
            opening = self._async_opening
        async with opening:
            if self._async_pool is None:
                pool = connections.async_sibling_pool(
                    self._queue.pool,
                    name=HANDLERS,
                    max_size=self._async_size,
                    timeout=self._queue.pool.timeout,
                    application_name=HANDLERS,
                )
                await pool.open()
                with self._lock:
                    self._async_pool = pool
                    self._async_loop = loop
            assert self._async_pool is not None
            return self._async_pool

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise RuntimeError("the worker has stopped: it lends no more connections")
