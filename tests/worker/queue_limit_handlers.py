"""Handlers for the queue-control tests (``--handlers queue_limit_handlers:RECORDING``):
each attempt writes its start and end, on the database clock, to the table named by
PGQUEUE_TEST_RUNS_TABLE, from its own connection."""

from __future__ import annotations

import os
import threading
import time

import psycopg
from psycopg import sql

from pgqueue import Job

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


def record(job: Job) -> None:
    """Note the start, sleep ``payload["sleep"]`` seconds, note the end."""
    conn = _connection()
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (job_id, attempt, pid, started_at)"
            " VALUES (%s, %s, %s, clock_timestamp())"
        ).format(_table()),
        (job.id, job.attempts, os.getpid()),
    )
    time.sleep(job.payload.get("sleep", 0))
    conn.execute(
        sql.SQL(
            "UPDATE {} SET ended_at = clock_timestamp() WHERE job_id = %s AND attempt = %s"
        ).format(_table()),
        (job.id, job.attempts),
    )


RECORDING = {"record": record}
