"""Partition keys with real worker processes: a partition concurrency limit holds across
workers while different keys run side by side, a partition rate limit paces each key on
its own while the keys progress together, and a key with a long backlog does not hold
back a small one (fair share).

Handlers (partition_handlers.py) record each invocation on the database clock; the
bounds asserted are generous ones about behaviour, not measurements."""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import timedelta

from flow_support import (
    database_now,
    most_at_once,
    most_starts_within,
    overlapping,
    read_runs,
    start_flow_workers,
)
from polling import wait_for
from psycopg import sql

from pgqueue import JobSpec, Queue


def _succeeded(queue: Queue, name: str) -> int:
    counts = {s.queue: s.counts for s in queue.stats()}.get(name, {})
    return counts.get("succeeded", 0)


def _wait_all_succeeded(queue: Queue, name: str, count: int, timeout: float = 120) -> None:
    wait_for(
        lambda: _succeeded(queue, name) == count,
        timeout,
        what=f"{count} jobs of {name} to succeed",
    )


def test_a_partition_concurrency_limit_of_one_serialises_each_key_across_three_workers(
    queue: Queue, db, schema: str, flow_runs: dict[str, str], start_worker
) -> None:
    keys = ("a", "b", "c")
    queue.update_queue("flow", partition_concurrency_limit=1, create=True)
    # Two slots a worker, all three serving before the jobs come: no worker can hold
    # every key at once, nor take them all before the others are up.
    start_flow_workers(start_worker, 3, flow_runs, "--queue", "flow", "--concurrency", "2")
    queue.enqueue_many(
        JobSpec("record", {"sleep": 0.2}, queue="flow", partition_key=key)
        for _ in range(8)
        for key in keys
    )

    # While they run, the database never shows two running jobs of one key.
    running = sql.SQL(
        "SELECT partition_key, count(*) FROM {} WHERE state = 'running' AND queue = 'flow'"
        " GROUP BY 1"
    ).format(sql.Identifier(schema, "active_jobs"))
    most_running: dict[str, int] = defaultdict(int)
    deadline = time.monotonic() + 120
    while _succeeded(queue, "flow") < 24 and time.monotonic() < deadline:
        for key, count in db.execute(running).fetchall():
            most_running[key] = max(most_running[key], count)
        time.sleep(0.01)
    _wait_all_succeeded(queue, "flow", 24)
    assert all(most <= 1 for most in most_running.values()), dict(most_running)

    runs = read_runs(db, schema)
    assert len(runs) == 24 and {run.outcome for run in runs} == {"ok"}
    for key in keys:
        # The handlers' own record: one key's runs never overlap...
        intervals = [(r.started_at, r.ended_at) for r in runs if r.partition_key == key]
        assert len(intervals) == 8
        assert overlapping(intervals) == [], key
        # ...nor do its jobs' claims and acks (a job claimed ahead of a free slot counts
        # as running from its claim).
        jobs = queue.list(queue="flow", partition_key=key, limit=100).jobs
        assert len(jobs) == 8 and all(job.partition_key == key for job in jobs)
        held = [(job.started_at, job.finished_at) for job in jobs]
        assert overlapping(held) == [], key
    # Different keys did run at the same time, on more than one worker.
    assert most_at_once((r.started_at, r.ended_at) for r in runs) >= 2
    assert len({run.pid for run in runs}) >= 2


def test_a_partition_rate_limit_paces_each_key_on_its_own_while_both_progress(
    queue: Queue, db, schema: str, flow_runs: dict[str, str], start_worker
) -> None:
    queue.update_queue("paced", partition_rate_limit=5, create=True)
    queue.enqueue_many(
        JobSpec("record", queue="paced", partition_key=key) for key in ("a", "b") for _ in range(30)
    )
    start_flow_workers(start_worker, 2, flow_runs, "--queue", "paced", "--concurrency", "4")
    _wait_all_succeeded(queue, "paced", 60)

    runs = read_runs(db, schema)
    windows = {}
    for key in ("a", "b"):
        starts = sorted(r.started_at for r in runs if r.partition_key == key)
        assert len(starts) == 30
        took = (starts[-1] - starts[0]).total_seconds()
        # 30 jobs at 5 a second: about 6 s (the first needs no wait).
        assert 4 <= took <= 12, (key, took)
        # Spread, not bursty: a second holds about five starts of the key.
        most = most_starts_within(starts, timedelta(seconds=1))
        assert most <= 6, (key, most)
        windows[key] = (starts[0], starts[-1])
    # The keys progressed at the same time, not one after the other.
    (a_first, a_last), (b_first, b_last) = windows["a"], windows["b"]
    shared = min(a_last, b_last) - max(a_first, b_first)
    assert shared >= timedelta(seconds=3), windows


def test_a_small_key_is_not_held_back_by_a_big_keys_backlog(
    queue: Queue, db, schema: str, flow_runs: dict[str, str], start_worker
) -> None:
    queue.enqueue_many(JobSpec("record", queue="shared", partition_key="big") for _ in range(2000))
    queue.enqueue_many(JobSpec("record", queue="shared", partition_key="small") for _ in range(20))
    started = database_now(db)
    start_flow_workers(start_worker, 1, flow_runs, "--queue", "shared")
    _wait_all_succeeded(queue, "shared", 2020, timeout=300)

    finished = defaultdict(list)
    rows = db.execute(
        sql.SQL("SELECT partition_key, finished_at FROM {} WHERE queue = 'shared'").format(
            sql.Identifier(schema, "jobs")
        )
    ).fetchall()
    for key, finished_at in rows:
        finished[key].append(finished_at)
    assert len(finished["big"]) == 2000 and len(finished["small"]) == 20
    big_halfway = sorted(finished["big"])[999]
    last_small = max(finished["small"])
    assert last_small < big_halfway, (
        f"the last small job finished {(last_small - started).total_seconds():.2f} s in, "
        f"after half the big key's ({(big_halfway - started).total_seconds():.2f} s)"
    )
