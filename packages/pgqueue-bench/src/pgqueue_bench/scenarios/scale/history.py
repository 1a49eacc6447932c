"""The finished history the scale driver keeps, and what the catalogs say of the tables
that hold it.

:class:`HistoryWindow` fixes when a history's jobs finished, :func:`history_lines`
writes them in COPY text format, :func:`create_history_days` creates their day
partitions and :func:`load_history` loads, counts and freezes them, as a month of
traffic and pgqueue's pruner would have left them. :func:`relation_sizes` and
:func:`jobs_activity` read the tables' sizes and cumulative statistics, which the
measurements report before and after their work. ``pgqueue bench ui`` loads its
history with the same functions.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import psycopg

from pgqueue.history import Day
from pgqueue.job import FINISHED_STATES
from pgqueue_bench import handlers
from pgqueue_bench.progress import LiveLine
from pgqueue_bench.scenarios.scale.scenario import (
    COPY_CHUNK_ROWS,
    HISTORY_DAYS,
    OTHER_QUEUES,
    QUEUE_NAME,
)
from pgqueue_bench.scenarios.scale.statements import run_statement, statement


def _timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(sep=" ")


@dataclass(frozen=True)
class HistoryWindow:
    """When a history's jobs finished: evenly spread from ``start``, midnight UTC
    HISTORY_DAYS whole days before the day of ``end``, to ``end``; job ``n`` of
    ``total`` at ``start + n * step``. Fixed once per schema, so that every load of
    the same history spreads its jobs alike."""

    start: float
    end: float
    total: int

    @classmethod
    def ending(cls, end: float, total: int) -> HistoryWindow:
        """The window of a ``total``-job history ending at ``end`` (Unix time)."""
        first = datetime.fromtimestamp(end, UTC).date() - timedelta(days=HISTORY_DAYS)
        midnight = datetime(first.year, first.month, first.day, tzinfo=UTC)
        return cls(start=midnight.timestamp(), end=end, total=total)

    @property
    def step(self) -> float:
        return (self.end - self.start) / max(self.total, 1)

    def days(self) -> list[date]:
        """The UTC days the history's jobs finished on, oldest first."""
        first = datetime.fromtimestamp(self.start, UTC).date()
        last = datetime.fromtimestamp(self.end, UTC).date()
        return [first + timedelta(days=n) for n in range((last - first).days + 1)]


def history_lines(first: int, count: int, *, first_id: int, start: float, step: float) -> str:
    """``count`` finished jobs in COPY text format, numbered from ``first``, with ids
    from ``first_id``: 94% succeeded, 4% dead after five attempts, 2% cancelled while
    queued; 70% in the measured queue, the rest in two others. Job ``n`` finished at
    ``start + n * step``."""
    lines = []
    for n in range(first, first + count):
        job_id = first_id + n - first
        finished = start + n * step
        finished_at = _timestamp(finished)
        enqueued_at = _timestamp(finished - 2.0)
        kind = n % 10
        queue = QUEUE_NAME if kind < 7 else OTHER_QUEUES[kind % 2]
        task = handlers.NOOP_TASK if queue == QUEUE_NAME else f"{queue}_task"
        payload = f'{{"n": {n}, "account": "acct-{n % 100_000:05d}"}}'
        worker = f"host-{n % 8}:{1000 + n % 5000}:{n % 65536:08x}"
        fate = n % 50
        if fate < 2:  # dead
            row = (
                f"{job_id}\t{queue}\t{task}\t{payload}\t0\tdead\t{enqueued_at}\t5\t5\t"
                f"{worker}\t{enqueued_at}\t{finished_at}\t{finished_at}\t"
                "RuntimeError: upstream answered 503\t\\N"
            )
        elif fate == 2:  # cancelled before it ran
            row = (
                f"{job_id}\t{queue}\t{task}\t{payload}\t0\tcancelled\t{enqueued_at}\t0\t5\t"
                f"\\N\t{enqueued_at}\t\\N\t{finished_at}\t\\N\t\\N"
            )
        else:
            row = (
                f"{job_id}\t{queue}\t{task}\t{payload}\t0\tsucceeded\t{enqueued_at}\t1\t5\t"
                f"{worker}\t{enqueued_at}\t{_timestamp(finished - 0.05)}\t{finished_at}\t"
                '\\N\t{"ok": true}'
            )
        lines.append(row)
    return "\n".join(lines) + "\n"


def create_history_days(url: str, schema: str, window: HistoryWindow) -> int:
    """Create every finished state's partition for each day of ``window`` that does not
    exist yet, with pgqueue's own statement, as its pruner creates the coming days;
    without them the history would land in the DEFAULT partitions. Returns how many
    day partitions the window covers."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        for each in window.days():
            for state in FINISHED_STATES:
                Day(state, each).create(conn, schema)
    return len(window.days()) * len(FINISHED_STATES)


def load_history(
    url: str,
    schema: str,
    first: int,
    count: int,
    *,
    window: HistoryWindow,
    progress: LiveLine,
) -> dict[str, Any]:
    """COPY jobs ``first`` .. ``first + count - 1`` of the history spread over
    ``window`` into their day partitions, one committed COPY per chunk, with a block of
    ids taken from the job id sequence; add them to the queue counters; then VACUUM
    (FREEZE, ANALYZE). Returns the load's timings."""
    partitions = create_history_days(url, schema, window)
    began = time.monotonic()
    with psycopg.connect(url, connect_timeout=10) as conn:
        first_id = conn.execute(
            statement("history_ids_reserve", schema), {"count": count}
        ).fetchone()[0]  # type: ignore[index]
        conn.commit()
        for offset in range(first, first + count, COPY_CHUNK_ROWS):
            rows = min(COPY_CHUNK_ROWS, first + count - offset)
            lines = history_lines(
                offset,
                rows,
                first_id=first_id + offset - first,
                start=window.start,
                step=window.step,
            )
            with conn.cursor() as cur, cur.copy(statement("history_copy", schema)) as copy:
                copy.write(lines)
            conn.commit()
            progress.update(f"loading history: {offset + rows - first:,}/{count:,} rows")
        copied = time.monotonic() - began
        progress.update(f"counting history: {count:,} rows")
        conn.execute(
            statement("history_count", schema),
            {"first_id": first_id, "last_id": first_id + count - 1},
        )
        conn.commit()
    counted = time.monotonic() - began - copied
    run_statement(url, "history_vacuum_freeze", schema)
    with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
        run_statement(url, "checkpoint", schema)
    return {
        "rows": count,
        "first_id": first_id,
        "day_partitions": partitions,
        "copy_seconds": copied,
        "rows_per_second": count / copied if copied else None,
        "count_seconds": counted,
        "vacuum_freeze_seconds": time.monotonic() - began - copied - counted,
    }


def relation_sizes(url: str, schema: str) -> dict[str, Any]:
    """Bytes of every table, partition and index of the schema (a TOAST table under
    its table's name and " (toast)"), and the sums the charts show: active_jobs (the hot
    table) with its TOAST table, every partition of finished_jobs with theirs, every
    index, the indexes of each of the two, and the claim index."""
    rows = run_statement(url, "relation_sizes", schema, {"schema": schema})
    sizes: dict[str, int] = {}
    for row in rows:
        sizes[row["name"]] = row["bytes"]
        if row["toast_bytes"]:
            sizes[f"{row['name']} (toast)"] = row["toast_bytes"]

    def tables(of: str) -> list[dict[str, Any]]:
        return [row for row in rows if row["of_table"] == of and row["kind"] == "table"]

    def index_bytes(of: str | None = None) -> int:
        return sum(
            row["bytes"]
            for row in rows
            if row["kind"] == "index" and (of is None or row["of_table"] == of)
        )

    return {
        "relations": sizes,
        "active_table_bytes": sum(r["bytes"] + r["toast_bytes"] for r in tables("active_jobs")),
        "finished_table_bytes": sum(r["bytes"] + r["toast_bytes"] for r in tables("finished_jobs")),
        "finished_partitions": len(tables("finished_jobs")),
        "index_bytes": index_bytes(),
        "active_index_bytes": index_bytes("active_jobs"),
        "finished_index_bytes": index_bytes("finished_jobs"),
        "claim_index_bytes": sizes.get("active_jobs_claim_idx", 0),
    }


JOB_TABLES = ("active_jobs", "finished_jobs")


def jobs_activity(url: str, schema: str) -> dict[str, dict[str, Any]]:
    """Cumulative statistics (dead tuples, deletes, autovacuum runs, ...) of
    active_jobs and, summed over its partitions, of finished_jobs, by table name; an
    empty dict for a table the server has no statistics of yet."""
    rows = run_statement(url, "jobs_activity", schema, {"schema": schema})
    found = {row.pop("jobs_table"): row for row in rows}
    return {table: found.get(table, {}) for table in JOB_TABLES}


def settled_activity(url: str, schema: str, *, timeout: float = 10.0) -> dict[str, dict[str, Any]]:
    """``jobs_activity`` once the server has published the work done so far: sessions
    report their statistics up to a second after it, or when they end, so read until
    two readings half a second apart agree."""
    reading = jobs_activity(url, schema)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.5)
        again = jobs_activity(url, schema)
        if again == reading:
            break
        reading = again
    return reading
