"""Statement deadlines: a connection whose statement overruns its deadline is cut off.

A worker's statements must never hang: a claim, an outcome or a heartbeat that never
returns keeps its thread from everything queued behind it, while the heartbeat keeps
the leases alive, so the reaper never takes the jobs back. PostgreSQL's own
``statement_timeout`` cannot guard against every such hang: it does not run while
the server waits for the rest of a message the client never finishes sending, nor
while the client waits for an answer the server never got the question to. So the
deadline is kept on the client, by one watchdog thread for the whole process.

When a deadline passes, the watchdog first asks the server to cancel the statement,
then shuts the connection's socket down. The cancel ends a statement the server is
still running (waiting for a lock, say), which PostgreSQL would otherwise carry on
with, locks held, until it next writes to the closed connection; its transaction,
including a COMMIT already sent behind it in a pipeline, then rolls back. Shutting
the socket down ends whatever the client was waiting for at once, with a connection
error, and a server that was still reading the statement sees the connection close.
The pool discards the broken connection, and the caller retries as it does after any
lost connection.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

import psycopg

log = logging.getLogger("pgqueue.deadlines")


@dataclass(order=True)
class _Deadline:
    """One watched statement: when it is due, and the connection to cut off then."""

    due: float
    order: int
    conn: psycopg.Connection = field(compare=False)
    seconds: float = field(compare=False)
    what: str = field(compare=False)
    active: bool = field(default=True, compare=False)
    fired: bool = field(default=False, compare=False)


class DeadlineExceeded(Exception):
    """Raised by :meth:`Watchdog.watch` in place of the connection error that cutting
    the connection off caused, so that the caller can say what happened."""

    def __init__(self, what: str, seconds: float) -> None:
        super().__init__(
            f"{what} took longer than {seconds:g} s; its connection was closed and the "
            "statement rolled back"
        )
        self.what = what
        self.seconds = seconds


class Watchdog:
    """Cuts off connections whose statement overran its deadline, from one thread.

    The thread starts with the first deadline and sleeps until the earliest one is
    due; a statement that finishes in time only flags its entry, which costs a lock
    and a heap push per statement and no wake-up of the thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._heap: list[_Deadline] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    @contextmanager
    def watch(self, conn: psycopg.Connection, seconds: float, what: str) -> Iterator[None]:
        """Run the block with ``conn`` cut off if it lasts longer than ``seconds``.

        Raises :class:`DeadlineExceeded` if the deadline passed and the block failed
        (as it will, once its connection is cut off). After the block, the watchdog
        never touches ``conn`` again: the entry is retired under the same lock that
        guards cutting off, so a connection back in its pool is never cut off late.
        """
        entry = _Deadline(time.monotonic() + seconds, next(self._order), conn, seconds, what)
        with self._lock:
            heapq.heappush(self._heap, entry)
            if self._heap[0] is entry:
                self._changed.notify()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="pgqueue-deadlines", daemon=True
                )
                self._thread.start()
        try:
            yield
        except Exception as exc:
            if entry.fired:
                raise DeadlineExceeded(what, seconds) from exc
            raise
        finally:
            with self._lock:
                entry.active = False

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._heap or not self._heap[0].active:
                    if self._heap:
                        heapq.heappop(self._heap)  # finished in time
                    else:
                        self._changed.wait()
                entry = self._heap[0]
                delay = entry.due - time.monotonic()
                if delay > 0:
                    self._changed.wait(delay)
                    continue
                heapq.heappop(self._heap)
                entry.fired = True
                log.error(
                    "%s took longer than %g s: closing its connection to the database",
                    entry.what,
                    entry.seconds,
                )
                _cut_off(entry.conn)


CANCEL_TIMEOUT = 2.0
"""Seconds the watchdog waits for the server to take a cancel request."""


def _cut_off(conn: psycopg.Connection) -> None:
    """Cancel ``conn``'s statement on the server, then shut down its socket in both
    directions. The connection object stays open, for the thread that uses it to see
    the error; only the socket is ended.

    A duplicate descriptor is shut down, not closed: closing the connection's own
    descriptor from another thread could close a descriptor number the process has
    meanwhile reused for something else.
    """
    with suppress(Exception):
        conn.cancel_safe(timeout=CANCEL_TIMEOUT)
    with suppress(Exception):
        fd = os.dup(conn.pgconn.socket)
        sock = socket.socket(fileno=fd)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


WATCHDOG = Watchdog()
"""The process's one watchdog."""
