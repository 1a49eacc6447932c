"""Real ``pgqueue worker`` processes sharing one schedule of every second: one job per
tick, none twice, none missing; the scheduler role moving on when its worker is
killed; and the sync a worker does when it starts."""

from __future__ import annotations

import itertools
import re
import signal
import time
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from polling import wait_for
from processes import environment, start_worker, stop
from psycopg import sql

HERE = Path(__file__).resolve().parent
PLUGIN = "schedule_test_plugin"
ENQUEUED = re.compile(r"schedule every-second: enqueued job (\d+)")
TAKEOVER_BOUND = timedelta(seconds=1.25)
"""The documented bound: the interval (1 s) plus the followers' grace (0.25 s)."""

pytestmark = pytest.mark.slow


class Workers:
    """``pgqueue worker`` processes on one schema, with a log file each."""

    def __init__(self, tmp_path: Path, database_url: str, schema: str, **env: str) -> None:
        self.tmp_path = tmp_path
        self.args = [
            "--plugin",
            PLUGIN,
            "--no-plugin-autoload",
            "--poll-interval",
            "0.25",
            "--database-url",
            database_url,
            "--schema",
            schema,
        ]
        self.env = environment(HERE, **env)
        self.processes = []
        self.logs: list[Path] = []

    def start(self, *extra: str):
        log = self.tmp_path / f"worker{len(self.processes)}.log"
        process = start_worker([*self.args, *extra], self.env, log)
        self.processes.append(process)
        self.logs.append(log)
        return process

    def log(self, index: int) -> str:
        return self.logs[index].read_text(errors="replace")

    def wait_for_log(self, index: int, text: str) -> None:
        def seen() -> bool:
            if text in self.log(index):
                return True
            assert self.processes[index].poll() is None, self.log(index)
            return False

        wait_for(seen, 60, what=f"{text!r} in worker {index}'s log")

    def enqueued_by(self, index: int) -> list[int]:
        return [int(match) for match in ENQUEUED.findall(self.log(index))]


def ticks(db: psycopg.Connection, schema: str) -> list[tuple[datetime, datetime, int]]:
    """Each job of the schedule: its tick (from its key), when it was enqueued, its id."""
    rows = db.execute(
        sql.SQL(
            "SELECT idempotency_key, enqueued_at, id FROM {}.jobs "
            "WHERE idempotency_key LIKE 'schedule:every-second@%%' ORDER BY id"
        ).format(sql.Identifier(schema))
    ).fetchall()
    found = []
    for key, enqueued_at, job_id in rows:
        stamp = key.split("@", 1)[1].replace("Z", "+00:00")
        found.append((datetime.fromisoformat(stamp), enqueued_at, job_id))
    return found


def assert_one_job_per_tick(found: list[tuple[datetime, datetime, int]]) -> None:
    moments = [tick for tick, _, _ in found]
    assert len(moments) == len(set(moments)), "a tick has two jobs"
    moments.sort()
    gaps = [b - a for a, b in itertools.pairwise(moments)]
    assert all(gap == timedelta(seconds=1) for gap in gaps), f"missing ticks: {gaps}"


def test_three_workers_enqueue_one_job_per_second_none_twice_none_missing(
    tmp_path: Path, database_url: str, schema: str, db: psycopg.Connection
) -> None:
    workers = Workers(
        tmp_path, database_url, schema, PGQUEUE_TEST_SCHEDULES="every-second=* * * * * *"
    )
    try:
        for _ in range(3):
            workers.start()
        for index in range(3):
            workers.wait_for_log(index, "scheduler on")
        wait_for(lambda: ticks(db, schema), 60, what="the first tick")
        time.sleep(10)
    finally:
        codes = stop(workers.processes)
    assert codes == [0, 0, 0], [workers.log(i) for i in range(3)]

    found = ticks(db, schema)
    assert len(found) >= 9, found
    assert_one_job_per_tick(found)
    # Each job was enqueued by exactly one worker's round, and no round met a tick
    # that already had its job: the advisory lock let one worker at a time in.
    logged = sorted(job_id for i in range(3) for job_id in workers.enqueued_by(i))
    assert logged == sorted(job_id for _, _, job_id in found)
    assert not any("already had" in workers.log(i) for i in range(3))


def test_killing_the_worker_holding_the_scheduler_role_moves_it_to_another(
    tmp_path: Path, database_url: str, schema: str, db: psycopg.Connection
) -> None:
    workers = Workers(
        tmp_path, database_url, schema, PGQUEUE_TEST_SCHEDULES="every-second=* * * * * *"
    )
    try:
        for _ in range(3):
            workers.start()
        for index in range(3):
            workers.wait_for_log(index, "scheduler on")
        wait_for(lambda: len(ticks(db, schema)) >= 3, 60, what="three ticks")
        # The role is whoever enqueued the latest tick.
        latest = max(ticks(db, schema), key=lambda t: t[2])[2]
        holder = next(i for i in range(3) if latest in workers.enqueued_by(i))
        workers.processes[holder].send_signal(signal.SIGKILL)
        workers.processes[holder].wait(30)
        killed_at = db.execute("SELECT now()").fetchone()[0]
        time.sleep(5)
    finally:
        survivors = [p for i, p in enumerate(workers.processes) if i != holder]
        codes = stop(survivors)
    assert codes == [0, 0]

    found = ticks(db, schema)
    assert_one_job_per_tick(found)
    after = sorted((t for t in found if t[0] > killed_at), key=lambda t: t[0])
    assert len(after) >= 3, found
    first_tick, first_enqueued, first_id = after[0]
    assert first_enqueued - max(first_tick, killed_at) <= TAKEOVER_BOUND + timedelta(seconds=2)
    taken_by = [i for i in range(3) if i != holder and first_id in workers.enqueued_by(i)]
    assert len(taken_by) == 1
    assert all(job_id not in workers.enqueued_by(holder) for _, _, job_id in after)


def test_a_worker_syncs_its_plugins_schedules_when_it_starts(
    tmp_path: Path, database_url: str, schema: str, db: psycopg.Connection
) -> None:
    def run(declared: str, *extra: str, **env: str) -> str:
        workers = Workers(
            tmp_path / declared.replace(" ", "_").replace("*", "x"),
            database_url,
            schema,
            PGQUEUE_TEST_SCHEDULES=declared,
            **env,
        )
        workers.tmp_path.mkdir(parents=True, exist_ok=True)
        workers.start(*extra)
        try:
            workers.wait_for_log(0, "schedules synced")
        finally:
            assert stop(workers.processes) == [0]
        return workers.log(0)

    def table() -> dict[str, tuple]:
        return {
            row[0]: row[1:]
            for row in db.execute(
                sql.SQL(
                    "SELECT name, cron, enabled, disabled_by, removed_at IS NOT NULL "
                    "FROM {}.schedules"
                ).format(sql.Identifier(schema))
            ).fetchall()
        }

    log = run("a=0 4 * * 0,b=0 5 * * 0", PGQUEUE_NO_SCHEDULER="1")
    assert "schedules synced: 2 added, 0 updated, 0 disabled, 0 unchanged" in log
    assert "scheduler on" not in log
    assert table() == {"a": ("0 4 * * 0", True, None, False), "b": ("0 5 * * 0", True, None, False)}

    log = run("a=30 4 * * 0", "--no-scheduler")
    assert (
        "schedule a updated by plugin schedule_test_plugin: cron '0 4 * * 0' -> '30 4 * * 0'" in log
    )
    assert "schedule b disabled: plugin schedule_test_plugin no longer declares it" in log
    assert table() == {
        "a": ("30 4 * * 0", True, None, False),
        "b": ("0 5 * * 0", False, "sync", True),
    }

    log = run("a=30 4 * * 0")
    assert "schedules synced: 0 added, 0 updated, 0 disabled, 1 unchanged" in log
    assert "scheduler on" in log


def test_a_burst_worker_with_nothing_to_do_still_syncs_before_it_exits(
    tmp_path: Path, database_url: str, schema: str, db: psycopg.Connection
) -> None:
    workers = Workers(tmp_path, database_url, schema, PGQUEUE_TEST_SCHEDULES="a=0 4 * * 0")
    process = workers.start("--burst")
    assert process.wait(60) == 0, workers.log(0)
    assert "schedules synced: 1 added" in workers.log(0)
    names = db.execute(
        sql.SQL("SELECT name FROM {}.schedules").format(sql.Identifier(schema))
    ).fetchall()
    assert names == [("a",)]
