"""Writing the progress that handlers report (:meth:`pgqueue.Job.progress`), coalesced.

A handler may report progress in a tight loop; the database must not see a row
written per call. A report only replaces the attempt's latest value here, in memory.
This writer's thread writes the latest value of every attempt that reported since its
last round in one statement (``WorkerProtocol.write_progress``), and then waits
INTERVAL seconds before the next: whatever the number of calls and of jobs, a worker
writes progress at most once per interval, and each job's row at most once per
interval. The latest value always lands: an attempt that returns has its value not yet
written written before its outcome is handed on (:meth:`ProgressWriter.settle`), so
the job's last report is the one it keeps.

Every write is fenced by the attempt's lease token: a report from an attempt whose
lease was lost (cancelled, reaped after a stall) writes nothing. Progress is best
effort: a write the database refuses is logged, and the next report tries again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from pgqueue import DatabaseUnavailable, Lease, WorkerProtocol

log = logging.getLogger("pgqueue.worker")

INTERVAL = 1.0
"""Seconds between a worker's progress writes: each job's row is written at most this
often, the last report of an attempt always."""
SETTLE_TRIES = 5
"""How often the last report of an attempt is tried while its row is locked by another
statement (a heartbeat, for a moment), SETTLE_PAUSE seconds apart."""
SETTLE_PAUSE = 0.02

Report = tuple[float, str | None]


class ProgressWriter:
    """Coalesces the progress reports of the attempts a worker runs and writes them
    through ``protocol`` on a thread of its own, at most once per ``interval``."""

    def __init__(self, protocol: WorkerProtocol, *, interval: float = INTERVAL) -> None:
        self.protocol = protocol
        self.interval = interval
        self._changed = threading.Condition()
        self._latest: dict[Lease, Report] = {}
        """The latest report of each attempt not written yet."""
        self._writing: set[Lease] = set()
        """The attempts whose report the thread is writing now."""
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="pgqueue-progress", daemon=True)

    def start(self) -> None:
        """Start the writer's thread."""
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the thread (reports not written by then are dropped: their attempts'
        outcomes were not written either, and the jobs run again)."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def sink(self, lease: Lease) -> Callable[[float, str | None], None]:
        """What an attempt's :meth:`pgqueue.Job.progress` calls: records its latest
        report, at no cost beyond a lock and a dict entry."""

        def report(fraction: float, message: str | None) -> None:
            with self._changed:
                first = not self._latest
                self._latest[lease] = (fraction, message)
                if first:
                    self._changed.notify_all()

        return report

    def settle(self, lease: Lease) -> Callable[[], None] | None:
        """After the attempt under ``lease`` returned: None if it has nothing left to
        write, else a function that writes its last report (waiting for a write of it
        under way), to call before its outcome is handed on. A coroutine's caller runs
        that function on a thread of its own, not on the event loop."""
        with self._changed:
            if lease not in self._latest and lease not in self._writing:
                return None
        return lambda: self._write_last(lease)

    def _write_last(self, lease: Lease) -> None:
        with self._changed:
            # A round under way may hold this attempt's report: let it end first, so
            # this one is not overtaken by an older value.
            self._changed.wait_for(lambda: lease not in self._writing)
            latest = self._latest.pop(lease, None)
        if latest is None:
            return
        for _ in range(SETTLE_TRIES):
            try:
                if self.protocol.write_progress([(lease, *latest)]):
                    return
            except DatabaseUnavailable as exc:
                log.warning("could not write the progress of job %s: %s", lease.job_id, exc)
                return
            # Nothing written: the row is locked right now, or the lease is gone.
            time.sleep(SETTLE_PAUSE)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._latest or self._stopping)
                if self._stopping:
                    return
                batch, self._latest = self._latest, {}
                self._writing = set(batch)
            try:
                written = set(
                    self.protocol.write_progress(
                        (lease, fraction, message) for lease, (fraction, message) in batch.items()
                    )
                )
            except DatabaseUnavailable as exc:
                log.warning("could not write the progress of %d jobs: %s", len(batch), exc)
                written = set()
            except Exception:
                log.exception("writing the progress of %d jobs failed", len(batch))
                written = set()
            with self._changed:
                # A report not written (its row locked for a moment, or the database
                # away) is tried again next round, unless a newer one replaced it. One
                # whose lease was lost is tried again too, until its attempt returns.
                for lease, report in batch.items():
                    if lease.job_id not in written:
                        self._latest.setdefault(lease, report)
                self._writing = set()
                self._changed.notify_all()
                # At most one round per interval, however often handlers report.
                if self._changed.wait_for(lambda: self._stopping, self.interval):
                    return
