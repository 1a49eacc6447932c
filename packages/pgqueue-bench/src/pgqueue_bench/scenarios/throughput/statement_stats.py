"""The server's time per statement during a throughput run, from pg_stat_statements
(``pgqueue bench throughput --statements``).

CPU per job says what a drain costs the server as a whole; this says which statements
it went to: each statement's calls, rows and execution time over the run, per job.
Execution time is the server's wall time in the executor (lock waits included, round
trips and parsing not), so on a busy machine it grows with the load; compared between
two modes measured one after the other it shows where their costs differ.

The server must load the extension at start (``shared_preload_libraries``): a private
cluster does, when its PostgreSQL ships it (the system PostgreSQL 15 here does; the
embedded PostgreSQL 18 does not).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgqueue_bench.sql.queries import statement_in

SQL_FILE = "statement_stats.sql"
SERVER_SETTINGS = {"shared_preload_libraries": "pg_stat_statements"}
"""What a private cluster starts with for :func:`enable` to succeed."""
TOP_STATEMENTS = 25
QUERY_CHARS = 300
"""A statement's text is kept up to this long: enough to tell which one it is."""


class StatementStatsUnavailable(RuntimeError):
    """The server does not load pg_stat_statements."""


def enable(url: str) -> None:
    """Create the extension where it is missing; raise StatementStatsUnavailable, saying
    why, when the server cannot provide it."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(statement_in(SQL_FILE, "statement_stats_enable"))
            conn.execute(statement_in(SQL_FILE, "statement_stats_reset"))
    except psycopg.Error as exc:
        raise StatementStatsUnavailable(
            "pg_stat_statements is not available on this server (it must be installed "
            f"and in shared_preload_libraries): {exc}"
        ) from exc


def reset(url: str) -> None:
    """Forget every statement counted so far."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(statement_in(SQL_FILE, "statement_stats_reset"))


def read(url: str, jobs: int) -> list[dict[str, Any]]:
    """The statements run since :func:`reset`, the most costly first, each with its
    figures per job of a run of ``jobs`` jobs."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        cur = conn.cursor(row_factory=dict_row)
        rows = cur.execute(
            statement_in(SQL_FILE, "statement_stats_read"), {"limit": TOP_STATEMENTS}
        ).fetchall()
    return [
        {
            "query": " ".join(row["query"].split())[:QUERY_CHARS],
            "calls": row["calls"],
            "rows": row["rows"],
            "total_exec_ms": row["total_exec_ms"],
            "total_plan_ms": row["total_plan_ms"],
            "exec_us_per_job": row["total_exec_ms"] * 1000 / jobs if jobs else None,
            "calls_per_1000_jobs": row["calls"] * 1000 / jobs if jobs else None,
        }
        for row in rows
    ]
