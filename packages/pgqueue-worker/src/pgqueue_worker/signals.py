"""SIGTERM and SIGINT: the first asks the worker to stop gracefully, a second exits now."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from pgqueue_worker.worker import Worker

log = logging.getLogger("pgqueue.worker")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def stop_on_signals(worker: Worker) -> Iterator[None]:
    """While inside, SIGTERM or SIGINT calls ``worker.stop()``: it claims nothing more,
    lets running handlers finish and writes their outcomes. A second signal exits the
    process at once with status 128 + the signal number (143 for SIGTERM, 130 for
    SIGINT: what a shell shows for a process the signal killed, and distinct from every
    status ``pgqueue worker`` exits with by itself), leaving running jobs to their
    leases. Must be entered in the main thread."""
    received = 0

    def handle(signum: int, frame: FrameType | None) -> None:
        nonlocal received
        received += 1
        name = signal.Signals(signum).name
        if received == 1:
            log.warning(
                "%s received: finishing %d running jobs; send it again to exit at once",
                name,
                worker.running_jobs,
            )
            worker.stop()
            return
        log.warning("%s received again: exiting now, running jobs are left to their leases", name)
        os._exit(128 + signum)

    previous = {sig: signal.signal(sig, handle) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
