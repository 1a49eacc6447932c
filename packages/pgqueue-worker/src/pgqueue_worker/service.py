"""Background threads: a duty on a thread of its own (the listener), duties that run
every few seconds, and helpers that work on what the claim loop hands them."""

from __future__ import annotations

import logging
import random
import threading

from pgqueue import DatabaseUnavailable
from pgqueue_worker.outage import Backoff, DatabaseHealth

log = logging.getLogger("pgqueue.worker")


class StoppableThread:
    """A duty on a thread of its own: :meth:`_run` runs there until it sees ``_stopped``
    set, which :meth:`stop` does."""

    def __init__(self, thread_name: str) -> None:
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Ask the thread to stop and wait up to ``timeout`` seconds for it."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        raise NotImplementedError


class PeriodicService(StoppableThread):
    """Calls :meth:`tick` every ``interval`` seconds until stopped.

    When the database is unavailable the tick is retried sooner, with backoff, but
    never later than the regular interval. Any other exception is logged with its
    traceback and the service carries on: a background duty must not die quietly.
    """

    name = "service"

    def __init__(self, interval: float, health: DatabaseHealth, *, jitter: bool = False) -> None:
        super().__init__(f"pgqueue-{self.name}")
        self.interval = interval
        self.health = health
        self._jitter = jitter

    def tick(self) -> bool:
        """One round of the duty; True if it wrote to the database (which proves the
        database takes writes again after an outage)."""
        raise NotImplementedError

    def initial_delay(self) -> float:
        """Seconds from the start to the first round: with jitter, a random share of the
        interval, so that workers started together spread their first rounds out."""
        return random.uniform(0, self.interval) if self._jitter else self.interval

    def next_delay(self) -> float:
        """Seconds from the end of a round to the next: ``interval``, unless a service
        knows better (the scheduler sleeps until the next tick is due)."""
        return self.interval

    def _run(self) -> None:
        backoff = Backoff(maximum=self.interval)
        delay = self.initial_delay()
        while not self._stopped.wait(delay):
            try:
                wrote = self.tick()
            except DatabaseUnavailable as exc:
                self.health.failed(self.name, exc)
                delay = backoff.next()
                continue
            except Exception:
                log.exception("%s failed; trying again in %.1f s", self.name, self.interval)
            else:
                if wrote:
                    self.health.succeeded()
            backoff.reset()
            delay = self.next_delay()


class HandOffService:
    """A thread that works on what other threads hand it, until stopped.

    Subclasses keep what they are handed under ``_changed``, notify it when they add
    some, and implement :meth:`_run`, which waits on it until there is work or
    ``_stopping`` is set.
    """

    thread_name = "pgqueue-service"

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the work in progress, if any, and wait up to ``timeout`` seconds
        for the thread."""
        with self._changed:
            self._stopping = True
            self._changed.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        raise NotImplementedError
