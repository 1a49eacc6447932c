"""Jobs finished per minute over the last hour, kept up to date cheaply.

Counting an hour of finished jobs reads every one of them (hundreds of thousands at a
hundred jobs a second), too much for a page that refreshes every two seconds. A minute
that is over keeps its count (a job retried later still finished then), so each API
process reads the whole hour once, then, on each refresh, only the minutes since its
last read and the one before it. Refreshes within MIN_READ_SECONDS of the last read
share it.
"""

from __future__ import annotations

import math
import threading
import time
from datetime import UTC, datetime, timedelta

from pgqueue import Queue
from pgqueue.queue_metrics import FinishedMinute

MIN_READ_SECONDS = 1.5


class FinishedHistory:
    """One API process's memory of ``Queue.finished_per_minute``."""

    def __init__(self, minutes: int) -> None:
        self.minutes = minutes
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str, datetime], FinishedMinute] = {}
        self._read_at: float | None = None

    def rows(self, queue: Queue) -> list[FinishedMinute]:
        """The rows of the last ``minutes`` minutes, from memory and a short read."""
        with self._lock:
            now = time.monotonic()
            if self._read_at is not None and now - self._read_at < MIN_READ_SECONDS:
                return list(self._rows.values())
            if self._read_at is None:
                minutes = self.minutes
            else:
                # The minutes since the last read, and the one it was in: a job that
                # finished late in a minute may have committed after that read.
                elapsed = math.ceil((now - self._read_at) / 60)
                minutes = min(self.minutes, elapsed + 1)
            recent: list[FinishedMinute] = queue.finished_per_minute(minutes)
            self._read_at = now
            # The minutes read replace what was kept of them: from the first of them on
            # this process's clock or the database's, whichever is earlier.
            start = datetime.now(UTC).replace(second=0, microsecond=0)
            start -= timedelta(minutes=minutes - 1)
            if recent:
                start = min(start, min(row.minute for row in recent))
            kept = {key: row for key, row in self._rows.items() if row.minute < start}
            kept.update(((row.queue, row.state, row.minute), row) for row in recent)
            oldest = start - timedelta(minutes=self.minutes)
            self._rows = {key: row for key, row in kept.items() if row.minute >= oldest}
            return list(self._rows.values())
