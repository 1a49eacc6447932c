"""Evidence of every delivery: a row in ``bench_deliveries`` and a line in a
per-process invocation log.

The row is committed before the handler's work starts, so a worker killed in the
middle of a job still leaves proof that the job reached it. The invocation log is a
local file, written even when the database is down (during a restart), so the
drivers can tell handler invocations from deliveries that reached the database.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

from pgqueue_bench.queries import schema_statement

INVOCATION_LOG_PREFIX = "invocations-"


class DeliveryRecorder:
    """Writes delivery rows into ``schema`` on ``url``, one autocommit connection per
    handler thread, reconnecting after the server went away."""

    def __init__(self, url: str, schema: str) -> None:
        self.url = url
        self.insert = schema_statement("delivery_record", schema)
        self._local = threading.local()

    def _connection(self) -> psycopg.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=5)
            self._local.conn = conn
        return conn

    def record(self, job_id: int, attempt: int) -> None:
        """Commit one delivery row. Raises psycopg errors; the connection is dropped
        then, so the next call starts afresh."""
        try:
            self._connection().execute(
                self.insert, {"job_id": job_id, "attempt": attempt, "pid": os.getpid()}
            )
        except psycopg.Error:
            conn = getattr(self._local, "conn", None)
            if conn is not None:
                conn.close()
            raise


class InvocationLog:
    """Appends ``job_id attempt`` lines to ``<directory>/invocations-<pid>.log``.

    Each line is one ``write`` on an ``O_APPEND`` descriptor, so nothing is buffered
    in the process: a SIGKILL loses no line that was written."""

    def __init__(self, directory: Path | str) -> None:
        path = Path(directory) / f"{INVOCATION_LOG_PREFIX}{os.getpid()}.log"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def append(self, job_id: int, attempt: int) -> None:
        """Record one handler invocation."""
        os.write(self._fd, f"{job_id} {attempt}\n".encode())


def count_invocations(directory: Path | str) -> int:
    """How many handler invocations the invocation logs in ``directory`` hold."""
    total = 0
    for path in Path(directory).glob(f"{INVOCATION_LOG_PREFIX}*.log"):
        with path.open("rb") as lines:
            total += sum(1 for _ in lines)
    return total


@dataclass(frozen=True)
class DeliverySummary:
    """What the delivery table says about a run."""

    delivery_rows: int
    jobs_delivered: int
    most_deliveries_of_one_job: int

    @property
    def duplicate_deliveries(self) -> int:
        """Deliveries beyond the first of each job."""
        return self.delivery_rows - self.jobs_delivered


def summarize(url: str, schema: str) -> DeliverySummary:
    """Count the delivery rows of a run."""
    with psycopg.connect(url, connect_timeout=10) as conn:
        cur = conn.cursor(row_factory=dict_row)
        cur.execute(schema_statement("delivery_summary", schema))
        row = cur.fetchone()
    return DeliverySummary(
        delivery_rows=int(row["delivery_rows"]),
        jobs_delivered=int(row["jobs_delivered"]),
        most_deliveries_of_one_job=int(row["most_deliveries_of_one_job"]),
    )
