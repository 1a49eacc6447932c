"""Fixtures for the worker tests: real worker processes and in-process workers on this
test's schema, each stopped at the end of the test whatever happened."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from partition_handlers import RUNS_COLUMNS
from psycopg import sql
from worker_support import ThreadedWorker, WorkerProcess, worker_environment

from pgqueue import Queue
from pgqueue_worker import Worker

# Lines of each worker process's log shown under a failed test.
WORKER_LOG_LINES_SHOWN = 200

# In-process workers: short leases and intervals, so expiry and retries happen quickly.
FAST_WORKER = {
    "lease_seconds": 2.0,
    "heartbeat_seconds": 0.2,
    "poll_interval": 0.2,
    "reap_interval": 0.25,
    "shutdown_timeout": 30.0,
}


@pytest.fixture
def start_worker(
    database_url: str, schema: str, tmp_path: Path
) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``pgqueue worker`` on this test's schema with extra arguments; keyword
    ``env`` adds environment variables. Every worker started is gone after the test."""
    started: list[WorkerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        command = ["--database-url", database_url, "--schema", schema, *args]
        log_path = tmp_path / f"worker-{len(started) + 1}.log"
        process = WorkerProcess(command, worker_environment(tmp_path, **(env or {})), log_path)
        started.append(process)
        return process

    yield start
    for process in started:
        process.ensure_gone()
        # Shown by pytest only for a test that failed: what each worker logged last.
        if process.log_path.exists():
            tail = process.log().splitlines()[-WORKER_LOG_LINES_SHOWN:]
            print(f"--- {process.log_path.name}, last lines", *tail, sep="\n", file=sys.stderr)


@pytest.fixture
def run_worker(queue: Queue) -> Iterator[Callable[..., ThreadedWorker]]:
    """Run a Worker on a thread, on ``queue`` unless another is given; the keyword
    arguments override FAST_WORKER. Every worker is stopped after the test."""
    running: list[ThreadedWorker] = []

    def run(handlers: dict[str, Any], *, on: Queue | None = None, **options: Any) -> ThreadedWorker:
        worker = Worker(on or queue, handlers, **{**FAST_WORKER, **options})
        threaded = ThreadedWorker(worker)
        running.append(threaded)
        return threaded

    yield run
    for threaded in running:
        threaded.worker.stop()
    for threaded in running:
        threaded.thread.join(60)


@pytest.fixture
def flow_runs(db: psycopg.Connection, schema: str, database_url: str) -> dict[str, str]:
    """The table partition_handlers.py writes each invocation to, and the environment
    that tells a worker process where it is."""
    db.execute(
        sql.SQL("CREATE TABLE {} ({})").format(
            sql.Identifier(schema, "runs"), sql.SQL(RUNS_COLUMNS)
        )
    )
    return {
        "PGQUEUE_TEST_DATABASE_URL": database_url,
        "PGQUEUE_TEST_RUNS_TABLE": f"{schema}.runs",
    }
