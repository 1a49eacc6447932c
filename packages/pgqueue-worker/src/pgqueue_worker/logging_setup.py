"""Log output for ``pgqueue worker``: human-readable text, or one JSON object per line.

The lines that record each job's state changes come from core's built-in
``pgqueue.lifecycle_log`` plugin, which attaches ``job_id``, ``task``, ``queue``,
``attempt``, ``state`` and ``duration`` to its records; both formats show them, and
JSON makes them keys, so a log pipeline can filter on them.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from pgqueue import log_format

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")
JOB_FIELDS = ("job_id", "task", "queue", "attempt", "state", "duration")

# psycopg and its pool warn about every connection an outage breaks and every failed
# reconnection; the worker logs the outage itself, once.
_NOISY_DURING_OUTAGES = ("psycopg",)


class JsonFormatter(log_format.JsonFormatter):
    """One JSON object per record: time, level, logger, message, the job fields, the
    worker id, and the traceback if there is one."""

    def __init__(self, worker_id: str | None = None) -> None:
        super().__init__(JOB_FIELDS, static={"worker_id": worker_id} if worker_id else None)
        self.worker_id = worker_id


class TextFormatter(log_format.TextFormatter):
    """``time LEVEL logger: message [key=value ...]``, with the job fields in brackets."""

    def __init__(self) -> None:
        super().__init__(JOB_FIELDS)


def configure(
    log_format: str = "text",
    level: str = "info",
    *,
    worker_id: str | None = None,
    stream: TextIO | None = None,
) -> None:
    """Send all logging to ``stream`` (stderr) in ``log_format`` at ``level``."""
    if log_format not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(worker_id) if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in _NOISY_DURING_OUTAGES:
        logging.getLogger(name).setLevel(logging.ERROR)
