"""Pooled connections that producers keep between enqueues, so that a producer
enqueueing one job at a time does not pay the pool's checkout and return per job.

An enqueue without ``conn=`` is one INSERT in autocommit mode. Through
``pool.connection()`` it also takes the pool's lock twice, switches the connection to
autocommit and back, and commits nothing on the way out: about a fifth of the
client's CPU per job, more with many producer threads on one pool. Here a connection
taken from the pool is switched to autocommit once and, after the enqueue, parked on a
stack instead of going back; the next enqueue, on any thread, takes the connection
parked last (the one its thread most likely just used). Taking and parking are a
list's ``pop`` and ``append``, atomic under the GIL, so producers share no lock.

A parked connection is still checked out, as far as the pool knows. So that nobody
waits for a connection that a producer is not using, parked connections go back to
the pool (switched back out of autocommit):

- whenever a statement of anything else than an enqueue on the same Queue (or the
  :class:`~pgqueue.WorkerProtocol` made from it) needs a pooled connection
  (:meth:`ProducerConnections.for_others`, from ``QueueBase._connection``); and while
  it waits for one or uses it, or a producer thread waits in the pool for one, every
  enqueue gives its connection back as it ends, so that the pool hands it over at once;
- a connection that has been out of the pool for :data:`HOLD_SECONDS`, at the end of
  the enqueue that finds it so: a client waiting in the pool is then handed it, and
  the pool's own upkeep (``max_lifetime``, ``drain()``) reaches it;
- after an enqueue that failed on it, whatever the error: the pool then sees a
  connection that the server closed (a restart) and replaces it, as it does for a
  connection returned through ``pool.connection()``; and, when the server had closed
  it, every parked connection, likely closed too;
- when the Queue closes (:meth:`ProducerConnections.close`).

Only a Queue that owns its pool (``Queue.connect``) parks connections: with
``Queue(pool)``, the application may take connections from the pool itself, which
would not give parked ones back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

import psycopg
import psycopg_pool

HOLD_SECONDS = 1.0
"""How long a producer keeps a connection out of the pool before handing it back at
the end of an enqueue: far below the pool's timeout (5 s by default), so that a
client waiting for a connection gets one in time while producers are busy."""


class ProducerConnections:
    """The parked connections of one pool's producers (see the module's docstring)."""

    def __init__(self, pool: psycopg_pool.ConnectionPool) -> None:
        self.pool = pool
        # (connection, when it left the pool), the one parked last at the end.
        self._parked: list[tuple[psycopg.Connection, float]] = []
        self._closed = threading.Event()
        # Callers waiting for a connection of the pool, or using one they took from
        # it, other than producers with a connection in hand: while there are any, a
        # connection is given back after its enqueue, so that the pool hands it to a
        # waiting caller at once rather than after HOLD_SECONDS.
        self._others = 0
        self._lock = threading.Lock()

    @contextmanager
    def for_others(self) -> Iterator[psycopg.Connection]:
        """``pool.connection()`` for a statement that is no enqueue: the parked
        connections go back to the pool first, and while the statement waits for its
        connection or uses it, producers give theirs back after each enqueue instead
        of parking them (the connection it waits for may be one of theirs)."""
        with self._lock:
            self._others += 1
        try:
            self.release_idle()
            with self.pool.connection() as conn:
                yield conn
        finally:
            with self._lock:
                self._others -= 1

    @property
    def parked(self) -> int:
        """How many connections are parked now."""
        return len(self._parked)

    def take(self) -> tuple[psycopg.Connection, float]:
        """A connection in autocommit mode, and when it left the pool: the one parked
        last, or a new one from the pool (which may wait for one, up to its timeout,
        and raises what the pool raises). Give it to :meth:`park` or :meth:`release`."""
        try:
            return self._parked.pop()
        except IndexError:
            pass
        with self._lock:
            self._others += 1  # a producer waiting in the pool is served like the others
        try:
            conn = self.pool.getconn()
        finally:
            with self._lock:
                self._others -= 1
        try:
            conn.autocommit = True
        except BaseException:
            self.pool.putconn(conn)
            raise
        return conn, time.monotonic()

    def park(self, conn: psycopg.Connection, taken_at: float) -> None:
        """Keep ``conn``, taken from the pool at ``taken_at``, for the next enqueue; or
        give it back if it has been out for :data:`HOLD_SECONDS` or the Queue closed."""
        if self._others or self._closed.is_set() or time.monotonic() - taken_at >= HOLD_SECONDS:
            self.release(conn)
            return
        self._parked.append((conn, taken_at))
        if self._closed.is_set():  # closed while this was being parked: not left behind
            self.release_idle()

    def release(self, conn: psycopg.Connection) -> None:
        """Give ``conn`` back to the pool as the pool handed it out, out of autocommit
        mode; a connection that cannot be switched back (broken, or interrupted in
        the middle of a statement) is closed, and the pool replaces it."""
        try:
            if not conn.closed:
                conn.autocommit = False
        except psycopg.Error:
            conn.close()
        self.pool.putconn(conn)

    def release_idle(self) -> None:
        """Give every parked connection back to the pool."""
        while self._parked:
            try:
                conn, _ = self._parked.pop()
            except IndexError:  # another thread took the last one
                return
            self.release(conn)

    def close(self) -> None:
        """Park no more connections and give back those parked; a connection in use
        now goes back when its enqueue ends."""
        self._closed.set()
        self.release_idle()


class Borrowed:
    """``with Borrowed(connections) as conn:``: a connection of ``connections`` for one
    enqueue, parked again after it, released to the pool if the enqueue failed. A
    class, not a generator-based context manager, which would cost an enqueue about
    two microseconds more."""

    __slots__ = ("_conn", "_connections", "_taken_at")

    def __init__(self, connections: ProducerConnections) -> None:
        self._connections = connections

    def __enter__(self) -> psycopg.Connection:
        self._conn, self._taken_at = self._connections.take()
        return self._conn

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self._connections.park(self._conn, self._taken_at)
            return
        broken = self._conn.closed
        self._connections.release(self._conn)
        if broken:
            # The server closed it (a restart, a terminated backend): those parked
            # beside it are likely gone too. Back in the pool, they meet its checks
            # (pool.check() after an outage) instead of failing enqueues one by one.
            self._connections.release_idle()
