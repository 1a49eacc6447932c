"""The seed design's naive loop, which pgqueue's one-job-per-claim mode is measured
against (``pgqueue bench throughput --mode naive-loop``).

pgqueue's first design kept every job in one table, with notification triggers on
insert, and its workers were a loop: claim one job, run it, ack it. Each process here
runs that loop on that table, with that design's claim and ack statements, verbatim
(``sql/naive_loop.sql``), on one autocommit connection: no lease heartbeat, no reaper,
no LISTEN (an empty claim sleeps ``POLL_SECONDS``), no hooks, no thread but its own.
So it is the least a worker can do per job on the first design's storage. A crashed
process's jobs stay ``running``: nothing takes them back.

:func:`run_naive_loop` is the driver's side: a fresh schema with the first design's
table, ``workers`` loop processes, warm-up, one load at one commit, and the drain,
timed as :mod:`pgqueue_bench.scenarios.throughput.driver` times ``pgqueue worker``. Run as a module,
this file is one loop process::

    python -m pgqueue_bench.scenarios.throughput.naive_loop DATABASE_URL SCHEMA QUEUE
"""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

import psycopg
from psycopg.types.json import Jsonb

from pgqueue_bench import handlers
from pgqueue_bench.infra.fleet import WorkerFleet, WorkerSettings
from pgqueue_bench.infra.server_cpu import CpuSpent, server_cpu_of
from pgqueue_bench.progress import LiveLine
from pgqueue_bench.sql.queries import schema_statement_in
from pgqueue_bench.verdict.observe import wait_for

SQL_FILE = "naive_loop.sql"
POLL_SECONDS = 0.01
LEASE_SECONDS = 30.0
READY_LINE = "naive loop serving queue"
WARMUP_PAUSE = 0.2


def _statement(name: str, schema: str) -> psycopg.sql.Composed:
    return schema_statement_in(SQL_FILE, name, schema)


def serve(url: str, schema: str, queue: str) -> None:
    """Claim, run and ack one job at a time, forever (until a signal ends the process)."""
    claim = _statement("seed_job_claim", schema)
    ack = _statement("seed_job_ack", schema)
    claim_params = {
        "queues": [queue],
        "tasks": [handlers.NOOP_TASK],
        "limit": 1,
        "lease_seconds": LEASE_SECONDS,
        "worker_id": f"{socket.gethostname()}:{os.getpid()}",
    }
    columns: dict[str, int] | None = None
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        while True:
            cur = conn.execute(claim, claim_params)
            if columns is None:
                # The first design's columns by name, whatever their order in ``job.*``.
                assert cur.description is not None
                columns = {column.name: index for index, column in enumerate(cur.description)}
                print(READY_LINE, flush=True)
            row = cur.fetchone()
            if row is None:
                time.sleep(POLL_SECONDS)
                continue
            handlers.noop(row[columns["payload"]])
            conn.execute(
                ack,
                {
                    "ids": [row[columns["id"]]],
                    "tokens": [row[columns["lease_token"]]],
                    # The no-op handler returns None, which the first design stored as null.
                    "results": [Jsonb(None)],
                },
            ).fetchall()


class NaiveLoopFleet(WorkerFleet):
    """Naive loop processes instead of ``pgqueue worker``: started, stopped and logged as
    a :class:`WorkerFleet`'s are."""

    loop_module = __name__
    """The module each process runs (``python -m``): one whose ``serve`` is a loop."""

    def command(self) -> list[str]:
        """One loop process's command line."""
        return [
            *self.prefix,
            sys.executable,
            "-m",
            self.loop_module,
            self.url,
            self.schema,
            self.settings.queue,
        ]


def _progress(conn: psycopg.Connection, schema: str) -> dict[str, int]:
    row = conn.execute(_statement("seed_jobs_progress", schema)).fetchone()
    assert row is not None
    jobs, succeeded, warm_workers = row
    return {"jobs": jobs, "succeeded": succeeded, "warm_workers": warm_workers}


def _load(conn: psycopg.Connection, schema: str, queue: str, jobs: int, *, measured: bool) -> None:
    conn.execute(
        _statement("seed_jobs_load", schema),
        {"queue": queue, "task": handlers.NOOP_TASK, "jobs": jobs, "measured": measured},
    )


def _warm_up(
    conn: psycopg.Connection, schema: str, queue: str, workers: int, timeout: float
) -> int:
    """Load warm-up jobs until every loop process has run one (so each is connected and
    has run its statements). Returns how many warm-up jobs it took."""
    deadline = time.monotonic() + timeout
    loaded = 0
    while time.monotonic() < deadline:
        _load(conn, schema, queue, workers, measured=False)
        loaded += workers

        def warmed_up(expected: int = loaded) -> bool:
            return _progress(conn, schema)["succeeded"] >= expected

        wait_for(
            warmed_up,
            max(1.0, deadline - time.monotonic()),
            what="the warm-up jobs",
        )
        if _progress(conn, schema)["warm_workers"] >= workers:
            return loaded
        time.sleep(WARMUP_PAUSE)
    raise TimeoutError(f"only some of the {workers} loop processes ran warm-up jobs")


class DrainTimes(NamedTuple):
    """What a drain of measured jobs left in the jobs table, and the CPU it took."""

    jobs: int
    first_attempt_successes: int
    first_started: datetime | None
    last_finished: datetime | None
    cpu: CpuSpent | None = None
    """From just before the load until the last job finished."""


def run_naive_loop(
    url: str,
    queue: str,
    jobs: int,
    workers: int,
    *,
    timeout: float,
    log_dir: Path,
    progress: LiveLine,
    label: str,
    fleet_type: type[NaiveLoopFleet] = NaiveLoopFleet,
    before_load: Callable[[], None] | None = None,
) -> DrainTimes:
    """``workers`` loop processes (of ``fleet_type``: this module's loop, or another on
    the same table) drain ``jobs`` no-op jobs loaded at one commit, in a schema of their
    own, dropped afterwards. ``before_load`` is called once they are warm, just before
    the load."""
    schema = f"bench_naive_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(_statement("seed_schema_create", schema))
        try:
            with fleet_type(url, schema, WorkerSettings(queue=queue), log_dir) as fleet:
                fleet.start(workers)
                progress.update(f"{label}: starting {workers} loop processes", force=True)
                warmups = _warm_up(conn, schema, queue, workers, timeout)
                progress.update(f"{label}: loading {jobs} jobs", force=True)
                server_cpu = server_cpu_of(url)
                pids = [process.pid for process in fleet.processes]
                if before_load is not None:
                    before_load()
                cpu_before = CpuSpent.now(pids, server_cpu)
                _load(conn, schema, queue, jobs, measured=True)
                total = warmups + jobs

                def drained() -> bool:
                    if fleet.unexpected_exits():
                        raise RuntimeError(f"a loop process exited:\n{fleet.log_tail()}")
                    succeeded = _progress(conn, schema)["succeeded"]
                    progress.update(f"{label}: {succeeded}/{total} succeeded")
                    return succeeded >= total

                wait_for(drained, timeout, interval=0.25, what="the measured jobs")
                cpu = CpuSpent.now(pids, server_cpu).since(cpu_before)
                progress.clear()
            row = conn.execute(_statement("seed_jobs_outcome", schema)).fetchone()
            assert row is not None
        finally:
            conn.execute(_statement("seed_schema_drop", schema))
    measured, first_attempt_successes, first_started, last_finished = row
    return DrainTimes(measured, first_attempt_successes, first_started, last_finished, cpu)


if __name__ == "__main__":
    serve(*sys.argv[1:4])
