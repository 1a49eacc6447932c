"""Waiting for jobs to finish: one LISTEN connection per :class:`~pgqueue.Queue` wakes
every thread and coroutine of the process that waits for a job.

:meth:`pgqueue.Queue.wait`, :meth:`pgqueue.AsyncProducer.wait` and the API's
``GET /jobs/{id}?wait=S`` wait through the Queue's :class:`JobWatcher`. A waiter hands
its job's id to the watcher and sleeps on an event; the watcher's thread, on a
connection of its own:

- records the ids it waits for in ``job_waiters`` (one statement for all the ids that
  arrived since its last round), then reads their states (one statement more) and wakes
  the waiters of jobs already final, or that do not exist;
- LISTENs on the schema's done channel (:func:`pgqueue.settings.done_channel`), on which
  the statements that finish jobs announce, by id, the ones found in ``job_waiters``,
  and only those: acks pay nothing for waiting while nobody waits;
- renews its rows while it waits, deletes those of jobs nobody waits for any more, and
  re-reads the state of every job it waits for every ``recheck_interval`` seconds, in
  one statement: a safety net for an announcement lost to a race (a job finished by a
  statement that began before its row was recorded) that costs nothing per waiter;
- after a lost connection, reconnects, and records and reads every job again, so a job
  that finished meanwhile wakes its waiters at once.

So 500 requests waiting for 500 jobs hold one connection between them, and the
database sees a handful of statements per round, not one per waiter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

import psycopg

from pgqueue import connections, queries
from pgqueue.errors import error_line
from pgqueue.job import FINISHED_STATES

if TYPE_CHECKING:
    from pgqueue.queue import Queue

log = logging.getLogger("pgqueue.wait")

DEFAULT_RECHECK_SECONDS = 5.0
"""How often a watcher reads the state of every job it waits for, as a safety net."""

ROW_SECONDS = 60.0
"""How long a watcher's rows in ``job_waiters`` stay valid without renewal: a watcher
renews them every third of that, and the rows of one that died expire."""

_FINAL = frozenset(state.value for state in FINISHED_STATES)
_LONGEST_SLEEP = 1.0  # how long the thread sleeps at most between looks at the clock
# Reconnecting: after 0.1 s, doubling up to 5 s, so a waiter hears of its job soon
# after the database is back, without a tight loop while it is down.
_FIRST_RETRY = 0.1
_LAST_RETRY = 5.0


class _Sleeper(Protocol):
    def wake(self) -> None: ...


class _ThreadSleeper:
    def __init__(self) -> None:
        self.event = threading.Event()

    def wake(self) -> None:
        self.event.set()


class _TaskSleeper:
    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()

    def wake(self) -> None:
        # Called on the watcher's thread: the event belongs to the waiter's loop.
        with contextlib.suppress(RuntimeError):  # that loop has closed: nobody waits
            self.loop.call_soon_threadsafe(self.event.set)


class JobWatcher:
    """Wakes the waiters of this process when their jobs finish (see the module's
    docstring). Made by :meth:`pgqueue.Queue.job_watcher`, one per Queue; its thread
    and connection start with the first wait and end with :meth:`close`."""

    def __init__(self, queue: Queue, *, recheck_interval: float = DEFAULT_RECHECK_SECONDS) -> None:
        self.queue = queue
        self.recheck_interval = recheck_interval
        """Seconds between the re-reads of every waited job's state (a safety net)."""
        self.name = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        """The watcher's name in ``job_waiters``."""
        self._lock = threading.Lock()
        self._sleepers: dict[int, set[_Sleeper]] = {}
        self._arrived: set[int] = set()  # ids to record and read, next round
        self._left: set[int] = set()  # ids nobody here waits for any more
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._connected = threading.Event()
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)

    # -- the waiters' side ----------------------------------------------------------

    def wait(self, job_id: int, timeout: float) -> bool:
        """Block until job ``job_id`` is final, does not exist, or was announced as
        finished (True), or ``timeout`` seconds pass, or the watcher is closed (False)."""
        sleeper = _ThreadSleeper()
        if not self._add(job_id, sleeper):
            return False
        try:
            return sleeper.event.wait(max(0.0, timeout)) and not self._stopped.is_set()
        finally:
            self._remove(job_id, sleeper)

    async def wait_async(self, job_id: int, timeout: float) -> bool:
        """:meth:`wait` for asyncio code: awaits, holding no thread."""
        sleeper = _TaskSleeper()
        if not self._add(job_id, sleeper):
            return False
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                await sleeper.event.wait()
            return not self._stopped.is_set()
        except TimeoutError:
            return False
        finally:
            self._remove(job_id, sleeper)

    @property
    def waiting(self) -> int:
        """How many waits are under way."""
        with self._lock:
            return sum(len(sleepers) for sleepers in self._sleepers.values())

    def connected(self, timeout: float) -> bool:
        """Whether the watcher is listening, waiting up to ``timeout`` seconds for it."""
        return self._connected.wait(timeout)

    def close(self) -> None:
        """Stop the thread, deleting this watcher's rows (best effort: rows left behind
        expire), and wake every waiter, whose wait then ends as a timeout would."""
        self._stopped.set()
        self._poke()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=10)
        with self._lock:
            sleepers = [s for group in self._sleepers.values() for s in group]
        for sleeper in sleepers:
            sleeper.wake()
        for fd in (self._read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _add(self, job_id: int, sleeper: _Sleeper) -> bool:
        """Take a waiter on; False once the watcher is closed."""
        with self._lock:
            if self._stopped.is_set():
                return False
            group = self._sleepers.setdefault(job_id, set())
            if not group:
                self._arrived.add(job_id)
                self._left.discard(job_id)
            group.add(sleeper)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="pgqueue-job-watcher", daemon=True
                )
                self._thread.start()
        self._poke()
        return True

    def _remove(self, job_id: int, sleeper: _Sleeper) -> None:
        with self._lock:
            group = self._sleepers.get(job_id)
            if group is None:
                return
            group.discard(sleeper)
            if not group:
                del self._sleepers[job_id]
                if job_id in self._arrived:
                    self._arrived.discard(job_id)  # never recorded: nothing to delete
                else:
                    self._left.add(job_id)

    def _poke(self) -> None:
        with contextlib.suppress(OSError):  # full (a wake-up is pending) or closed
            os.write(self._write_fd, b"\0")

    def _wake(self, job_ids: Iterable[int]) -> None:
        with self._lock:
            sleepers = [s for job_id in job_ids for s in self._sleepers.get(job_id, ())]
        for sleeper in sleepers:
            sleeper.wake()

    # -- the watcher's thread -------------------------------------------------------

    def _run(self) -> None:
        delay = _FIRST_RETRY
        broken = False
        while not self._stopped.is_set():
            try:
                with connections.connect_beside(
                    self.queue.pool, application_name="pgqueue-wait"
                ) as conn:
                    conn.execute(queries.bind("job_waiters_listen", self.queue.schema))
                    with self._lock:
                        # Announcements sent while nobody listened reached no one:
                        # record and read every job again.
                        self._arrived |= set(self._sleepers)
                        self._left.clear()
                    self._connected.set()
                    delay = _FIRST_RETRY
                    if broken:
                        log.warning("waiting for jobs on a new connection")
                        broken = False
                    self._serve(conn)
                    self._forget_all(conn)
            except psycopg.Error as exc:
                self._connected.clear()
                if not broken:
                    log.warning(
                        "lost the connection that waits for jobs (%s); reconnecting, and "
                        "reading every waited job's state once back",
                        error_line(exc),
                    )
                    broken = True
                self._stopped.wait(delay)
                delay = min(delay * 2, _LAST_RETRY)
            except Exception:
                self._connected.clear()
                log.exception("job watcher failed; reconnecting")
                self._stopped.wait(delay)
                delay = min(delay * 2, _LAST_RETRY)
        self._connected.clear()

    def _serve(self, conn: psycopg.Connection) -> None:
        schema = self.queue.schema
        now = time.monotonic()
        renew_at = now + ROW_SECONDS / 3
        recheck_at = now + self.recheck_interval
        # poll, not select: a server holding a thousand client sockets has descriptors
        # beyond select's limit.
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN)
        poller.register(self._read_fd, select.POLLIN)
        while not self._stopped.is_set():
            with self._lock:
                arrived, self._arrived = self._arrived, set()
                left, self._left = self._left, set()
            if left:
                conn.execute(
                    queries.bind("job_waiters_forget", schema),
                    {"waiter": self.name, "ids": sorted(left)},
                )
            if arrived:
                self._record(conn, arrived)
                self._read_states(conn, arrived)
            now = time.monotonic()
            if now >= renew_at:
                with self._lock:
                    waited = set(self._sleepers) - self._arrived
                if waited:
                    self._record(conn, waited)
                conn.execute(queries.bind("job_waiters_expired_delete", schema))
                renew_at = now + ROW_SECONDS / 3
            if now >= recheck_at:
                with self._lock:
                    waited = set(self._sleepers) - self._arrived
                if waited:
                    self._read_states(conn, waited)
                recheck_at = now + self.recheck_interval
            self._take_announcements(conn)
            sleep = min(renew_at, recheck_at) - time.monotonic()
            ready = poller.poll(max(0.0, min(sleep, _LONGEST_SLEEP)) * 1000)
            if any(fd == self._read_fd for fd, _ in ready):
                with contextlib.suppress(BlockingIOError):
                    while os.read(self._read_fd, 4096):
                        pass

    def _record(self, conn: psycopg.Connection, job_ids: set[int]) -> None:
        conn.execute(
            queries.bind("job_waiters_register", self.queue.schema),
            {"waiter": self.name, "ids": sorted(job_ids), "seconds": ROW_SECONDS},
        )

    def _read_states(self, conn: psycopg.Connection, job_ids: set[int]) -> None:
        rows = conn.execute(
            queries.bind("job_waiters_states", self.queue.schema), {"ids": sorted(job_ids)}
        ).fetchall()
        states = {row[0]: row[1] for row in rows}
        # Final, or no such job (never was, or pruned): either way the wait is over.
        self._wake(job_id for job_id in job_ids if states.get(job_id, "succeeded") in _FINAL)

    def _take_announcements(self, conn: psycopg.Connection) -> None:
        # Those received while a statement ran wait in psycopg's backlog; the rest are
        # read now, without waiting (timeout 0).
        finished = []
        for notification in conn.notifies(timeout=0):
            with contextlib.suppress(ValueError):
                finished.append(int(notification.payload))
        if finished:
            self._wake(finished)

    def _forget_all(self, conn: psycopg.Connection) -> None:
        with contextlib.suppress(psycopg.Error):
            conn.execute(
                queries.bind("job_waiters_forget", self.queue.schema),
                {"waiter": self.name, "ids": None},
            )
