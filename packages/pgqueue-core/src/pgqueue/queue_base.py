"""The base of :class:`pgqueue.Queue`: settings and statement plumbing shared by its parts."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg
import psycopg.errors
import psycopg_pool

from pgqueue import jsonb, queries
from pgqueue.deadlines import WATCHDOG, DeadlineExceeded
from pgqueue.errors import DatabaseUnavailable, error_line
from pgqueue.producer_connections import ProducerConnections

# SQLSTATE classes that mean "the database cannot take this now", not "your call is
# wrong": connection loss, admin shutdown, read-only server, disk full, timeouts.
UNAVAILABLE = (
    psycopg.OperationalError,
    psycopg_pool.PoolTimeout,
    psycopg.errors.ReadOnlySqlTransaction,
    psycopg.errors.InsufficientResources,
    psycopg.errors.QueryCanceled,
    psycopg.errors.LockNotAvailable,
)


class QueueBase:
    """What every part of :class:`pgqueue.Queue` stands on: its settings, and the one
    way its statements reach the database (a pooled connection, or the caller's own),
    with database failures turned into :class:`~pgqueue.errors.DatabaseUnavailable`.
    Queue's parts (producing, metrics, pruning, ...) and those of
    :class:`~pgqueue.WorkerProtocol` (claiming, outcomes) subclass it; each of the two
    sets these attributes in its ``__init__``."""

    pool: psycopg_pool.ConnectionPool
    schema: str
    hooks: Any
    retry_base: float
    retry_cap: float
    max_payload_bytes: int
    max_result_bytes: int
    statement_timeout: float | None
    _producer_connections: ProducerConnections | None = None
    """The connections producers keep between enqueues, when the Queue owns its pool
    (see :mod:`pgqueue.producer_connections`)."""

    def _sql(self, name: str, lock: str = "skip-locked") -> psycopg.sql.SQL:
        return queries.bind(name, self.schema, lock)

    @contextmanager
    def _connection(self, conn: psycopg.Connection | None = None) -> Iterator[psycopg.Connection]:
        """A pooled connection in a transaction that commits on exit, or the caller's own
        connection untouched (its transaction is the caller's to commit)."""
        try:
            if conn is not None:
                yield conn
            elif self.statement_timeout is None:
                with self._pooled() as pooled:
                    yield pooled
            else:
                with (
                    self._pooled() as pooled,
                    WATCHDOG.watch(pooled, self.statement_timeout, "a statement"),
                ):
                    yield pooled
        except UNAVAILABLE as exc:
            raise DatabaseUnavailable(describe_unavailable(exc)) from exc
        except DeadlineExceeded as exc:
            raise DatabaseUnavailable(f"database unavailable: {exc}") from exc

    def _pooled(self) -> AbstractContextManager[psycopg.Connection]:
        """``pool.connection()``; when producers keep connections of the pool, through
        :meth:`~pgqueue.producer_connections.ProducerConnections.for_others`, so that
        no statement waits for a connection a producer keeps."""
        producers = self._producer_connections
        return self.pool.connection() if producers is None else producers.for_others()

    def _rows(
        self,
        name: str,
        params: dict[str, Any] | None = None,
        *,
        conn: psycopg.Connection[Any] | None = None,
        lock: str = "skip-locked",
    ) -> list[dict[str, Any]]:
        with self._connection(conn) as c:
            cur = jsonb.cursor(c)
            cur.execute(self._sql(name, lock), params)
            return cur.fetchall() if cur.description else []

    def _notify(self, hook: str, **kwargs: Any) -> None:
        if self.hooks is not None:
            self.hooks.call(hook, **kwargs)

    def _notify_each(self, hook: str, calls: Iterable[Mapping[str, Any]]) -> None:
        if self.hooks is not None:
            self.hooks.call_each(hook, calls)


def send_commit(conn: psycopg.Connection) -> None:
    """Queue a COMMIT in ``conn``'s pipeline, as a statement of its own.

    Not ``conn.commit()``: inside a pipeline, psycopg (3.3 at least) then sends a Sync
    and waits for the results with part of a large statement still unsent in libpq's
    output buffer, while the server waits for the rest of it: both wait forever (see
    docs/psycopg-pipeline-commit-hang.md). The COMMIT sent as a statement is flushed,
    with everything before it, by the pipeline's exit, which sends until its buffer is
    empty before it reads; and it still commits in the same round trip, so a worker
    cut off after sending never leaves its transaction open, holding the rows.
    """
    conn.execute(b"COMMIT", prepare=False)


def describe_unavailable(exc: BaseException) -> str:
    return f"database unavailable: {error_line(exc)}"
