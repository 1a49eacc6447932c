"""Riding out database trouble: capped exponential backoff, and one log line per outage.

Every part of a worker that talks to PostgreSQL (the claim loop, the heartbeat, the
reaper) reports its failures and successes to one shared :class:`DatabaseHealth`, so
an outage is logged once when it starts and once when it ends, however many threads
notice it, instead of once per retry.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

import psycopg_pool

from pgqueue import DatabaseUnavailable, Queue
from pgqueue.errors import error_line
from pgqueue.queue_base import QueueBase
from pgqueue_worker import connections

log = logging.getLogger("pgqueue.worker")

MAX_BACKOFF_SECONDS = 10.0


class Backoff:
    """Delays that double from ``initial`` up to ``maximum``, half fixed and half random
    so that a fleet of workers does not retry in lockstep."""

    def __init__(self, initial: float = 0.25, maximum: float = MAX_BACKOFF_SECONDS) -> None:
        self.initial = initial
        self.maximum = maximum
        self._ceiling = initial

    def next(self) -> float:
        """The delay before the next retry; each call doubles the one after it."""
        ceiling = self._ceiling
        self._ceiling = min(self.maximum, self._ceiling * 2)
        return ceiling / 2 + random.random() * ceiling / 2

    def reset(self) -> None:
        """Start again from ``initial`` (after a success)."""
        self._ceiling = self.initial


class DatabaseHealth:
    """Whether the database is taking this worker's writes, logged on each change.

    ``probe``, if given, is asked why the database is unavailable when a call failed
    only because the pool had no connection to give (psycopg_pool's timeout says
    nothing of the cause): it returns the reason, with host and port, or None.
    """

    def __init__(self, probe: Callable[[], str | None] | None = None) -> None:
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._probe = probe
        self._created = time.monotonic()
        self._seen_up = False
        self.cause: str | None = None
        """What the current (or last) outage is, in one line."""
        self._cause_is_pool_timeout = False
        self.failures = 0
        """Database calls reported failed, ever (for the worker's metrics)."""
        self.outages = 0
        """Outages begun, ever: runs of failures ended by a success count once."""

    @property
    def down(self) -> bool:
        """True from the first failure until the next success."""
        return self._down_since is not None

    def down_for(self, now: float) -> float:
        """Seconds (on the monotonic clock, ``now``) the database has been unavailable;
        0 while it is not. Until a first success, counted from this object's creation:
        a worker that never reached its database has been without it from the start."""
        down_since = self._down_since
        if down_since is None:
            return 0.0
        return now - (down_since if self._seen_up else self._created)

    def failed(self, where: str, error: BaseException) -> None:
        """A database call made by ``where`` failed; log it if it starts an outage."""
        with self._lock:
            self.failures += 1
            already_down = self._down_since is not None
            if not already_down:
                self._down_since = time.monotonic()
                self.outages += 1
        description = _describe(error)
        pool_timeout = _from_pool_timeout(error)
        if already_down:
            if not pool_timeout or self.cause is None:
                self.cause = description
                self._cause_is_pool_timeout = pool_timeout
            log.debug("%s (%s); still retrying", description, where)
            return
        probed = self._probe() if pool_timeout and self._probe is not None else None
        self.cause = probed or description
        self._cause_is_pool_timeout = pool_timeout and not probed
        log.warning(
            "%s (%s); retrying with backoff up to %.0f s",
            description,
            where,
            MAX_BACKOFF_SECONDS,
        )

    def explain(self) -> str | None:
        """:attr:`cause`, or, when all that is known of the outage is the pool's timeout
        (which names no cause: another thread may have reported it while the first
        failure was being probed), the probe's answer now."""
        if self._cause_is_pool_timeout and self._probe is not None:
            probed = self._probe()
            if probed:
                self.cause = probed
                self._cause_is_pool_timeout = False
        return self.cause

    def succeeded(self) -> None:
        """A write went through (a read proves nothing: a read-only server answers
        those); log the end of the outage if there was one."""
        if self._down_since is None:  # the common case, without taking the lock
            self._seen_up = True
            return
        lasted = self._end_outage()
        if lasted is not None:
            log.warning("database available again after %.1f s", lasted)

    def _end_outage(self) -> float | None:
        """End the outage under the lock and return how long it lasted, or None when
        another thread ended it since the caller looked."""
        with self._lock:
            if self._down_since is None:
                return None
            lasted = time.monotonic() - self._down_since
            self._down_since = None
            self._seen_up = True
            return lasted


def _from_pool_timeout(error: BaseException) -> bool:
    """Whether ``error`` comes of psycopg_pool's timeout, however deeply wrapped."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, psycopg_pool.PoolTimeout):
            return True
        seen.add(id(cause))
        cause = cause.__cause__
    return False


def _describe(error: BaseException) -> str:
    text = error_line(error)
    # DatabaseUnavailable already says so; anything else is said as Queue says it.
    return text if text.startswith("database unavailable") else f"database unavailable: {text}"


def why_unavailable(queue: Queue) -> str | None:
    """Connect to the queue's database on a connection of its own and say why that
    fails (host, port, cause), or None if it works. The connection is named
    ``pgqueue-worker-probe``: it lasts a moment, beside the worker's budget of held
    connections, and ``pg_stat_activity`` should not count it in the pool's."""
    try:
        queue.ping(timeout=2.0, application_name=connections.PROBE)
    except DatabaseUnavailable as exc:
        return str(exc)
    return None


def discard_broken_connections(queue: QueueBase) -> None:
    """After a connection error, test the pool's idle connections and replace the dead
    ones now, rather than have each later call find one (after a server restart, every
    pooled connection is dead)."""
    try:
        queue.pool.check()
    except Exception:
        log.debug("checking the pool's connections failed", exc_info=True)
