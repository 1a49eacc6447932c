"""Completion in the handler's transaction under real ``pgqueue worker`` processes:
a worker stalled past its lease (SIGSTOP) while its handler's transaction is open, its
job reaped and run again by another worker, then resumed (SIGCONT), finds its lease
lost at ``job.complete``: its row is rolled back, and the new attempt's row stays
alone. A fenced transaction keeps its lease extended by the heartbeat however long it
lasts."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from polling import wait_for
from worker_support import FAST, TEST_PLUGIN, hook_calls, wait_until_state

from pgqueue import JobState, Queue

pytestmark = pytest.mark.slow

HANDLERS = ("--handlers", "effects_handlers:HANDLERS", "--plugin", TEST_PLUGIN)


@pytest.fixture
def app_table(db: psycopg.Connection, schema: str) -> str:
    db.execute(
        f"CREATE TABLE {schema}.app_rows (job_id bigint NOT NULL, attempt int NOT NULL,"
        " pid int NOT NULL)"
    )
    return f"{schema}.app_rows"


def app_rows(db: psycopg.Connection, table: str) -> list[tuple[Any, ...]]:
    return db.execute(f"SELECT job_id, attempt, pid FROM {table} ORDER BY 1, 2").fetchall()


@pytest.mark.parametrize("task", ["in_transaction", "own_connection"])
def test_a_stalled_worker_resumed_after_its_job_ran_again_writes_nothing(
    task: str, start_worker, queue: Queue, db, app_table, database_url, tmp_path: Path
) -> None:
    hold = str(tmp_path / "job")
    job = queue.enqueue(task, {"table": app_table, "hold": hold, "url": database_url}).job
    stalled = start_worker(*FAST, *HANDLERS)
    wait_for(lambda: Path(f"{hold}.held").exists(), what="the first attempt to write its row")
    # Frozen inside its transaction, its row written, past its 1 s lease.
    stalled.signal(signal.SIGSTOP)
    rescuer = start_worker(*FAST, *HANDLERS)
    done = wait_until_state(queue, job.id, JobState.SUCCEEDED)
    assert done.attempts == 2 and done.result == {"attempt": 2, "pid": rescuer.pid}
    assert "lease expired" in done.errors[0]["error"]

    stalled.signal(signal.SIGCONT)
    Path(f"{hold}.go").touch()
    wait_for(lambda: Path(f"{hold}.lost").exists(), what="the stale attempt to meet LeaseLost")
    assert "cannot commit" in Path(f"{hold}.lost").read_text()
    stalled.wait_for_log("outcome discarded")

    # The stale attempt's row was rolled back with its transaction: one row, the
    # rescuer's, and the job as the rescuer left it.
    assert app_rows(db, app_table) == [(job.id, 2, rescuer.pid)]
    after = queue.get(job.id)
    assert after.state is JobState.SUCCEEDED and after.result == done.result
    assert after.finished_at == done.finished_at
    for worker in (stalled, rescuer):
        assert worker.stop() == 0, worker.log()
    successes = [c for c in hook_calls(tmp_path) if c["hook"] == "on_success"]
    assert [(c["job_id"], c["pid"]) for c in successes] == [(job.id, rescuer.pid)]


def test_each_completed_job_runs_on_success_once_and_is_acked_once(
    start_worker, queue: Queue, db, app_table, database_url, schema, tmp_path: Path
) -> None:
    tasks = ["in_transaction", "own_connection", "in_async_transaction"]
    jobs = [
        queue.enqueue(tasks[n % 3], {"table": app_table, "url": database_url}).job
        for n in range(60)
    ]
    # Leases long enough that no attempt here expires on a loaded machine: what is
    # counted is completions and hooks, not reaps (the tests above reap on purpose).
    steady = (*FAST, "--lease-seconds", "15", "--heartbeat-seconds", "1")
    workers = [start_worker(*steady, *HANDLERS) for _ in range(2)]
    for job in jobs:
        wait_until_state(queue, job.id, JobState.SUCCEEDED)
    for worker in workers:
        assert worker.stop() == 0, worker.log()
        assert "LeaseLost" not in worker.log() and "lost" not in worker.log(), worker.log()
    rows = app_rows(db, app_table)
    assert [(job_id, attempt) for job_id, attempt, _ in rows] == [(job.id, 1) for job in jobs]
    successes = Counter(c["job_id"] for c in hook_calls(tmp_path) if c["hook"] == "on_success")
    assert successes == dict.fromkeys((job.id for job in jobs), 1)
    # Each job's row and its finished row were written by one transaction.
    same = db.execute(
        f"SELECT count(*) FROM {app_table} AS app JOIN {schema}.finished_jobs AS job"
        " ON job.id = app.job_id WHERE app.xmin = job.xmin"
    ).fetchone()
    assert same == (60,)
    completed = db.execute(
        f"SELECT sum(succeeded)::int, sum(completed)::int FROM {schema}.queue_counters"
    ).fetchone()
    assert completed == (60, 60)


def test_a_fenced_transaction_keeps_its_lease_extended_by_the_heartbeat(
    start_worker, queue: Queue, db, app_table, schema, tmp_path: Path
) -> None:
    hold = str(tmp_path / "job")
    job = queue.enqueue("in_transaction", {"table": app_table, "hold": hold, "fence": True}).job
    holder = start_worker(*FAST, *HANDLERS)
    wait_for(lambda: Path(f"{hold}.held").exists(), what="the fenced attempt to write its row")
    reaper = start_worker(*FAST, *HANDLERS)  # reaps every 0.25 s
    # Three leases long, the heartbeat extends the lease of the fenced job each beat.
    started = time.monotonic()
    expiries = []
    while time.monotonic() - started < 3.0:
        row = db.execute(
            f"SELECT lease_expires_at, lease_expires_at > now(), attempts"
            f" FROM {schema}.active_jobs WHERE id = %s",
            (job.id,),
        ).fetchone()
        assert row is not None and row[1] and row[2] == 1, row
        expiries.append(row[0])
        time.sleep(0.2)
    assert len(set(expiries)) > 5
    Path(f"{hold}.go").touch()
    done = wait_until_state(queue, job.id, JobState.SUCCEEDED)
    assert done.attempts == 1 and done.errors == []
    assert app_rows(db, app_table) == [(job.id, 1, holder.pid)]
    for worker in (holder, reaper):
        assert worker.stop() == 0, worker.log()
