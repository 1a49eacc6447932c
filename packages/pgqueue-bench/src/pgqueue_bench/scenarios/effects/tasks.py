"""The handlers of ``pgqueue bench effects``, a plugin its workers load by name::

    pgqueue worker --plugin pgqueue_bench.scenarios.effects.tasks --no-plugin-autoload

Both write one row per run into an application table (``effects_rows``, which has no
unique constraint, so that a second row for a job stays there to be counted), then work
for the payload's ``work_ms`` (a range in milliseconds):

- ``effects_fenced`` writes the row and completes the job in one transaction, fenced by
  the attempt's lease: with ``with job.transaction() as conn:`` (a connection the worker
  lends) when the payload says ``"via": "transaction"``, or on a connection of its own
  with ``job.complete(conn)`` when it says ``"via": "own_connection"``;
- ``effects_plain`` writes the row in a transaction of its own, then returns, and the
  worker acks the job afterwards: the handler of at-least-once delivery.

Each run is logged to a local file before anything else (it survives the database
being down), per handler under the directory :data:`RUN_DIR_VARIABLE` names, and each
completion the fence refused (:class:`pgqueue.LeaseLost`) beside them, so the driver
can tell runs, rows and refusals apart.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from typing import Any

import psycopg

from pgqueue import Job, LeaseLost, hookimpl
from pgqueue_bench import handlers
from pgqueue_bench.sql.queries import schema_statement_in
from pgqueue_bench.verdict.deliveries import LazyInvocationLog, ThreadConnections

QUEUE = "bench_effects"
FENCED_TASK = "effects_fenced"
PLAIN_TASK = "effects_plain"
TASKS = (FENCED_TASK, PLAIN_TASK)
VIA_TRANSACTION = "transaction"
VIA_OWN_CONNECTION = "own_connection"
FENCED_WAYS = (VIA_TRANSACTION, VIA_OWN_CONNECTION)
LEASE_LOST_LOG = "lease_lost"
"""The subdirectory of the run directory where refused completions are logged."""
RUN_DIR_VARIABLE = "PGQUEUE_EFFECTS_RUN_DIR"
APPLICATION_NAME = "pgqueue-bench-effects"
"""The ``application_name`` of the handlers' own connections: the chaos loop
terminates them along with the worker's."""
SQL_FILE = "effects.sql"

_runs = {task: LazyInvocationLog(RUN_DIR_VARIABLE, task) for task in TASKS}
_lease_lost = LazyInvocationLog(RUN_DIR_VARIABLE, LEASE_LOST_LOG)
_connections: ThreadConnections | None = None


def _own_connections() -> ThreadConnections:
    """The handlers' own connections (their application's pool, as it were), to the
    database the driver named in the worker's environment."""
    global _connections
    if _connections is None:
        try:
            url = os.environ[handlers.DATABASE_URL_VARIABLE]
        except KeyError:
            raise RuntimeError(
                f"the effects handlers need {handlers.DATABASE_URL_VARIABLE} in the worker's "
                "environment"
            ) from None
        _connections = ThreadConnections(url, application_name=APPLICATION_NAME)
    return _connections


def _write_row(conn: psycopg.Connection, job: Job) -> None:
    """The handler's side effect: one row in the application table."""
    schema = os.environ[handlers.SCHEMA_VARIABLE]
    conn.execute(
        schema_statement_in(SQL_FILE, "effects_row_insert", schema),
        {
            "job_id": job.id,
            "task": job.task,
            "attempt": job.attempts,
            "lease_token": job.lease_token,
            "pid": os.getpid(),
        },
    )


def _work(payload: dict[str, Any]) -> None:
    low, high = payload["work_ms"]
    time.sleep(random.uniform(low, high) / 1000)


def fenced(payload: dict[str, Any], job: Job) -> None:
    """Write the row and complete the job in the same transaction."""
    _runs[FENCED_TASK].append(job.id, job.attempts, job.lease_token)
    connections = _own_connections() if payload["via"] == VIA_OWN_CONNECTION else None
    try:
        if connections is None:
            with job.transaction() as conn:
                _write_row(conn, job)
                _work(payload)
        else:
            conn = connections.get()
            with conn.transaction():
                _write_row(conn, job)
                _work(payload)
                job.complete(conn)
    except LeaseLost:
        # The attempt lost its lease while it worked (it stalled past it, or its worker
        # lost the database): another attempt owns the job, and this row rolled back.
        _lease_lost.append(job.id, job.attempts, job.lease_token)
        raise
    except psycopg.Error:
        if connections is not None:
            connections.discard()
        raise


def plain(payload: dict[str, Any], job: Job) -> None:
    """Write the row (committed at once), then return: the worker acks afterwards."""
    _runs[PLAIN_TASK].append(job.id, job.attempts, job.lease_token)
    connections = _own_connections()
    try:
        _write_row(connections.get(), job)
    except psycopg.Error:
        connections.discard()
        raise
    _work(payload)


@hookimpl
def register_tasks(register: Callable[..., None]) -> None:
    register(FENCED_TASK, fenced)
    register(PLAIN_TASK, plain)
