"""Waking the claim loop: LISTEN/NOTIFY for new jobs, on a connection of its own.

Enqueueing sends a notification whose payload is the queue's name when the enqueuing
transaction commits. The listener wakes the claim loop for the queues it serves, so a
new job is claimed within milliseconds instead of at the next poll.

When the listening connection breaks (a server restart, ``pg_terminate_backend``, a
network fault) the worker falls back to polling and the listener reconnects with
backoff. Once it listens again it wakes the claim loop once, to pick up whatever was
enqueued while nobody was listening.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import weakref
from collections.abc import Callable, Collection

import psycopg

from pgqueue import DatabaseUnavailable, WorkerProtocol
from pgqueue.errors import first_line
from pgqueue.settings import notify_channel
from pgqueue_worker.outage import Backoff
from pgqueue_worker.service import StoppableThread

log = logging.getLogger("pgqueue.worker")

# How often the listener looks up from waiting to see whether it should stop.
STOP_CHECK_SECONDS = 0.5


class WakeSignal:
    """Wakes the claim loop from other threads and from signal handlers.

    A self-pipe rather than a ``threading.Event``: setting it takes no lock, so it is
    safe in a signal handler that may interrupt the very thread that is waiting.
    """

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        # Closed only once nothing can reach this object any more: a handler thread
        # finishing late could otherwise write to a file descriptor number reused by
        # something else.
        weakref.finalize(self, _close_fds, self._read_fd, self._write_fd)
        self._poller = select.poll()
        self._poller.register(self._read_fd, select.POLLIN)

    def set(self) -> None:
        """Wake the waiter (now, or at its next wait)."""
        # A full pipe holds wake-ups enough already.
        with contextlib.suppress(BlockingIOError):
            os.write(self._write_fd, b"\0")

    def wait(self, timeout: float | None) -> bool:
        """Wait until set or ``timeout`` seconds pass; True if set. Clears it."""
        ready = self._poller.poll(None if timeout is None else max(0, timeout) * 1000)
        if not ready:
            return False
        self.clear()
        return True

    def clear(self) -> None:
        """Forget wake-ups already sent."""
        try:
            while os.read(self._read_fd, 4096):
                pass
        except BlockingIOError:
            pass


def _close_fds(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class Listener(StoppableThread):
    """LISTENs on ``protocol``'s channel and calls ``wake()`` for notifications naming one of
    ``queues``, on a thread of its own. ``connect()`` opens a new autocommit connection;
    :meth:`stop` also closes it.

    It runs on the thread scaffolding of the reaper and the pruner
    (:class:`~pgqueue_worker.service.StoppableThread`), but is no
    :class:`~pgqueue_worker.service.PeriodicService` like them: it has no rounds to run
    every interval, but holds one connection for as long as that lasts; and a broken
    connection is no outage to report to the worker's database health (the worker polls
    meanwhile), so it reconnects with a backoff of its own from 0.1 s, not from the
    interval."""

    def __init__(
        self,
        protocol: WorkerProtocol,
        queues: Collection[str],
        *,
        connect: Callable[[], psycopg.Connection],
        wake: Callable[[], None],
        poll_interval: float,
    ) -> None:
        super().__init__("pgqueue-listen")
        self.protocol = protocol
        self.queues = frozenset(queues)
        self.channel = notify_channel(protocol.schema)
        self._connect = connect
        self._wake = wake
        self._poll_interval = poll_interval

    def _run(self) -> None:
        backoff = Backoff(initial=0.1)
        broken_since_logged = False
        while not self._stopped.is_set():
            try:
                with self._connect() as conn:
                    self.protocol.listen(conn)
                    backoff.reset()
                    if broken_since_logged:
                        log.warning("listening on channel %s again", self.channel)
                        broken_since_logged = False
                    else:
                        log.debug("listening on channel %s", self.channel)
                    # Jobs enqueued while nobody listened sent their notifications to
                    # no one: look for them now.
                    self._wake()
                    self._listen(conn)
            except (psycopg.Error, DatabaseUnavailable) as exc:
                if not broken_since_logged:
                    log.warning(
                        "cannot listen (%s); polling every %g s until the listening connection "
                        "is back",
                        first_line(exc),
                        self._poll_interval,
                    )
                    broken_since_logged = True
                self._stopped.wait(backoff.next())
            except Exception:
                log.exception("listener failed; reconnecting")
                self._stopped.wait(backoff.next())

    def _listen(self, conn: psycopg.Connection) -> None:
        while not self._stopped.is_set():
            for notification in conn.notifies(timeout=STOP_CHECK_SECONDS):
                if notification.payload in self.queues:
                    self._wake()
