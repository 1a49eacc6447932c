"""Reading what the flow-control handlers (partition_handlers.py) recorded, and the
shapes the tests look for in it: overlaps, starts per window, gaps."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

import psycopg
from psycopg import sql
from worker_support import FAST, WorkerProcess

HANDLERS = ("--handlers", "partition_handlers:FLOW", "--no-plugin-autoload")


@dataclass(frozen=True)
class Run:
    """One handler invocation, as the handler wrote it (database clock)."""

    job_id: int
    attempt: int
    partition_key: str | None
    pid: int
    started_at: datetime
    ended_at: datetime | None
    outcome: str | None


def read_runs(db: psycopg.Connection, schema: str) -> list[Run]:
    """Every invocation so far, in order of start."""
    rows = db.execute(
        sql.SQL(
            "SELECT job_id, attempt, partition_key, pid, started_at, ended_at, outcome"
            " FROM {} ORDER BY started_at, job_id"
        ).format(sql.Identifier(schema, "runs"))
    ).fetchall()
    return [Run(*row) for row in rows]


def database_now(db: psycopg.Connection) -> datetime:
    return db.execute("SELECT clock_timestamp()").fetchone()[0]


def most_at_once(intervals: Iterable[tuple[datetime, datetime | None]]) -> int:
    """The most intervals open at one instant (an open one lasts for ever). An end and a
    start at the same instant do not overlap."""
    edges = []
    for started, ended in intervals:
        edges.append((started, 1))
        edges.append((_end((started, ended)), -1))
    most = now = 0
    for _, step in sorted(edges):
        now += step
        most = max(most, now)
    return most


def _end(interval: tuple[datetime, datetime | None]) -> datetime:
    return interval[1] or datetime.max.replace(tzinfo=interval[0].tzinfo)


def overlapping(
    intervals: list[tuple[datetime, datetime | None]],
) -> list[tuple[tuple[datetime, datetime | None], tuple[datetime, datetime | None]]]:
    """Pairs of intervals that overlap (as evidence for a failed assertion)."""
    ordered = sorted(intervals, key=lambda interval: interval[0])
    return [
        (first, second)
        for i, first in enumerate(ordered)
        for second in ordered[i + 1 :]
        if second[0] < _end(first)
    ]


def most_starts_within(starts: list[datetime], window: timedelta) -> int:
    """The most starts in any half-open window of that length."""
    ordered = sorted(starts)
    most = 0
    first = 0
    for last, start in enumerate(ordered):
        while start - ordered[first] >= window:
            first += 1
        most = max(most, last - first + 1)
    return most


def start_flow_workers(
    start_worker: Callable[..., WorkerProcess],
    count: int,
    env: dict[str, str],
    *args: str,
) -> list[WorkerProcess]:
    """``count`` worker processes running the flow handlers with FAST intervals and
    ``args``; returned once each serves."""
    workers = [start_worker(*HANDLERS, *FAST, *args, env=env) for _ in range(count)]
    for worker in workers:
        worker.wait_for_log("serving queue")
    return workers
