"""Handlers for the flow-control tests (``--handlers partition_handlers:FLOW``).

Each invocation writes one row to the table named by PGQUEUE_TEST_RUNS_TABLE, from its
own connection, on the database clock: the job, its attempt count as the handler saw
it, its partition key, the process, when it started and ended, and how it ended
("ok" or "throttled").

``payload["sleep"]``: seconds to work. ``payload["throttle"]``: ``{"seconds": s,
"scope": "job" | "partition" | "queue", "times": n}`` raises ``pgqueue.Throttle`` on the
job's first ``n`` invocations (default 1), counted in that table, so a job throttled
once runs normally the next time.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import psycopg
from psycopg import sql

import pgqueue
from pgqueue import Job

RUNS_COLUMNS = (
    "job_id bigint NOT NULL, attempt int NOT NULL, partition_key text, pid int NOT NULL,"
    " started_at timestamptz NOT NULL, ended_at timestamptz, outcome text"
)
"""The runs table's columns (the tests create it with these)."""

_local = threading.local()


def _connection() -> psycopg.Connection:
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = psycopg.connect(os.environ["PGQUEUE_TEST_DATABASE_URL"], autocommit=True)
        _local.conn = conn
    return conn


def _table() -> sql.Identifier:
    schema, name = os.environ["PGQUEUE_TEST_RUNS_TABLE"].split(".")
    return sql.Identifier(schema, name)


_START = sql.SQL(
    "INSERT INTO {} (job_id, attempt, partition_key, pid, started_at)"
    " VALUES (%s, %s, %s, %s, clock_timestamp())"
    " RETURNING ctid::text, (SELECT count(*) FROM {} WHERE job_id = %s)"
)
_END = sql.SQL("UPDATE {} SET ended_at = clock_timestamp(), outcome = %s WHERE ctid = %s::tid")


def _throttle(payload: dict[str, Any], earlier_runs: int) -> pgqueue.Throttle | None:
    """The Throttle this invocation raises, if the payload asks for one now."""
    wanted = payload.get("throttle")
    if not wanted or earlier_runs >= int(wanted.get("times", 1)):
        return None
    return pgqueue.Throttle(float(wanted["seconds"]), scope=wanted.get("scope", "job"))


def record(payload: dict[str, Any], job: Job) -> str:
    """Note the start, throttle if asked to, else sleep ``payload["sleep"]``; note the end."""
    conn = _connection()
    table = _table()
    row = conn.execute(
        _START.format(table, table),
        (job.id, job.attempts, job.partition_key, os.getpid(), job.id),
    ).fetchone()
    assert row is not None
    ctid, earlier = row
    throttle = _throttle(payload, earlier)
    if throttle is not None:
        conn.execute(_END.format(table), ("throttled", ctid))
        raise throttle
    time.sleep(float(payload.get("sleep", 0)))
    conn.execute(_END.format(table), ("ok", ctid))
    return "ok"


async def record_async(payload: dict[str, Any], job: Job) -> str:
    """:func:`record` as a coroutine, on an async connection of its own."""
    table = _table()
    async with await psycopg.AsyncConnection.connect(
        os.environ["PGQUEUE_TEST_DATABASE_URL"], autocommit=True
    ) as conn:
        cur = await conn.execute(
            _START.format(table, table),
            (job.id, job.attempts, job.partition_key, os.getpid(), job.id),
        )
        row = await cur.fetchone()
        assert row is not None
        ctid, earlier = row
        throttle = _throttle(payload, earlier)
        if throttle is not None:
            await conn.execute(_END.format(table), ("throttled", ctid))
            raise throttle
        await asyncio.sleep(float(payload.get("sleep", 0)))
        await conn.execute(_END.format(table), ("ok", ctid))
    return "ok"


FLOW = {"record": record, "record_async": record_async}
