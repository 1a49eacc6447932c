"""Task handlers for the worker processes of the effects tests (``--handlers
effects_handlers:HANDLERS``): each writes a row of its attempt to the application
table named in its payload, in the transaction that completes its job.

A payload's ``hold`` names a file prefix: the first attempt touches ``<hold>.held``
once its row is written, inside its transaction, and waits for ``<hold>.go`` before it
completes; a LeaseLost it meets is written to ``<hold>.lost`` (and raised on)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import psycopg

from pgqueue import Job, LeaseLost

INSERT = "INSERT INTO {table} (job_id, attempt, pid) VALUES (%s, %s, %s)"


def _hold(payload: dict[str, Any], job: Job) -> None:
    hold = payload.get("hold")
    if not hold or job.attempts != 1:
        return
    Path(f"{hold}.held").touch()
    deadline = time.monotonic() + 120
    while not Path(f"{hold}.go").exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def _lost(payload: dict[str, Any], exc: LeaseLost) -> None:
    if payload.get("hold"):
        Path(f"{payload['hold']}.lost").write_text(str(exc))


def in_transaction(payload: dict[str, Any], job: Job) -> None:
    """job.transaction(): the worker's connection, completed on a clean exit."""
    try:
        with job.transaction() as conn:
            if payload.get("fence"):
                job.fence(conn)
            conn.execute(INSERT.format(table=payload["table"]), (job.id, job.attempts, os.getpid()))
            _hold(payload, job)
            job.set_result({"attempt": job.attempts, "pid": os.getpid()})
    except LeaseLost as exc:
        _lost(payload, exc)
        raise


def own_connection(payload: dict[str, Any], job: Job) -> str:
    """A connection of the handler's own (``payload["url"]``), completed explicitly."""
    with psycopg.connect(payload["url"]) as conn:
        conn.execute(INSERT.format(table=payload["table"]), (job.id, job.attempts, os.getpid()))
        _hold(payload, job)
        try:
            job.complete(conn, {"attempt": job.attempts, "pid": os.getpid()})
        except LeaseLost as exc:
            _lost(payload, exc)
            raise
    return "what a handler returns after completing is ignored"


async def in_async_transaction(payload: dict[str, Any], job: Job) -> None:
    """job.atransaction(), for an ``async def`` handler."""
    async with job.atransaction() as conn:
        await conn.execute(
            INSERT.format(table=payload["table"]), (job.id, job.attempts, os.getpid())
        )
        job.set_result({"attempt": job.attempts, "pid": os.getpid()})


HANDLERS = {
    "in_transaction": in_transaction,
    "own_connection": own_connection,
    "in_async_transaction": in_async_transaction,
}
