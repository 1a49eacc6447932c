"""What a timed run of the enqueue driver counted (:class:`Timing`), and the check that
turns it into the run's figures: the table must hold the jobs counted
(:func:`outcome`, from :func:`count_rows`), so that a broken run is never reported as
a fast one. Every kind of case ends here: producers in threads, wrk over HTTP, a
peer's own process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgqueue_bench.scenarios.enqueue.settings import STATEMENTS
from pgqueue_bench.sql.queries import one_row, statement_in


@dataclass
class Timing:
    """What a timed run of producers counted."""

    jobs: int
    calls: int
    seconds: float
    warmup_jobs: int
    client_cpu_seconds: float | None = None
    """CPU time of the producing process (all its threads) over the measured window,
    when the producers ran in this process."""
    server_cpu_seconds: float | None = None
    """CPU time of the PostgreSQL server over the measured window, when it runs on
    this machine (see :mod:`pgqueue_bench.infra.server_cpu`)."""


def count_rows(url: str, table: sql.Identifier) -> int:
    """Rows in ``table`` now."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        query = statement_in(STATEMENTS, "rows_count", table=table)
        return int(one_row(conn.execute(query))[0])


def outcome(timing: Timing, stored: int, *, extra_allowed: int = 0) -> dict[str, Any]:
    """A run's figures, verified: the table holds the jobs counted (warm-up included),
    or at most ``extra_allowed`` more (sent but unanswered when the load stopped). With
    the CPU times measured, also the client's and the server's CPU per job, in
    microseconds: where a case's time goes, which its rate alone does not say."""
    counted = timing.warmup_jobs + timing.jobs
    cpu = {
        f"{side}_cpu_us_per_job": round(seconds / timing.jobs * 1e6, 2)
        for side, seconds in (
            ("client", timing.client_cpu_seconds),
            ("server", timing.server_cpu_seconds),
        )
        if seconds is not None and timing.jobs
    }
    problems = []
    if not counted <= stored <= counted + extra_allowed:
        allowance = f" (+{extra_allowed} in flight)" if extra_allowed else ""
        problems.append(f"counted {counted}{allowance} jobs, the table holds {stored}")
    return {
        "jobs": timing.jobs,
        "calls": timing.calls,
        "seconds": round(timing.seconds, 3),
        "jobs_per_second": timing.jobs / timing.seconds if timing.seconds > 0 else None,
        "warmup_jobs": timing.warmup_jobs,
        **cpu,
        "rows_stored": stored,
        "verified": not problems,
        "problems": problems,
    }
