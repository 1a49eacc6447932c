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

from pgqueue import Queue

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
    """Whether the database is taking this worker's writes, logged on each change."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._down_since: float | None = None

    @property
    def down(self) -> bool:
        """True from the first failure until the next success."""
        return self._down_since is not None

    def failed(self, where: str, error: BaseException) -> None:
        """A database call made by ``where`` failed; log it if it starts an outage."""
        with self._lock:
            already_down = self._down_since is not None
            if not already_down:
                self._down_since = time.monotonic()
        if already_down:
            log.debug("%s (%s); still retrying", _describe(error), where)
            return
        log.warning(
            "%s (%s); retrying with backoff up to %.0f s",
            _describe(error),
            where,
            MAX_BACKOFF_SECONDS,
        )

    def succeeded(self) -> None:
        """A write went through (a read proves nothing: a read-only server answers
        those); log the end of the outage if there was one."""
        if self._down_since is None:  # the common case, without taking the lock
            return
        with self._lock:
            if self._down_since is None:
                return
            lasted = time.monotonic() - self._down_since
            self._down_since = None
        log.warning("database available again after %.1f s", lasted)


def _describe(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    # DatabaseUnavailable already says so; anything else gets the same prefix.
    return text if text.startswith("database unavailable") else f"database unavailable: {text}"


def discard_broken_connections(queue: Queue) -> None:
    """After a connection error, test the pool's idle connections and replace the dead
    ones now, rather than have each later call find one (after a server restart, every
    pooled connection is dead)."""
    try:
        queue.pool.check()
    except Exception:
        log.debug("checking the pool's connections failed", exc_info=True)
