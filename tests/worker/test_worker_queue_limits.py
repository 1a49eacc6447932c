"""Queue controls with real worker processes: a concurrency limit holds across four
workers, a rate limit paces every worker together, a pause stops new starts within a
second and a resume restarts them at once (NOTIFY, not the next poll).

Handlers record each attempt's start and end on the database clock; the bounds
asserted are the generous ones pgqueue promises, not measurements."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

import psycopg
import pytest
from polling import wait_for
from psycopg import sql
from worker_support import FAST, WorkerProcess

from pgqueue import JobSpec, Queue

HANDLERS = ("--handlers", "queue_limit_handlers:RECORDING", "--no-plugin-autoload")


@pytest.fixture
def runs(db: psycopg.Connection, schema: str, database_url: str) -> Iterator[dict[str, str]]:
    """The table the handlers write, and the environment that tells them where it is."""
    db.execute(
        sql.SQL(
            "CREATE TABLE {} (job_id bigint, attempt int, pid int,"
            " started_at timestamptz, ended_at timestamptz)"
        ).format(sql.Identifier(schema, "runs"))
    )
    yield {
        "PGQUEUE_TEST_DATABASE_URL": database_url,
        "PGQUEUE_TEST_RUNS_TABLE": f"{schema}.runs",
    }


def _runs(db: psycopg.Connection, schema: str) -> list[tuple[datetime, datetime | None]]:
    return db.execute(
        sql.SQL("SELECT started_at, ended_at FROM {} ORDER BY started_at").format(
            sql.Identifier(schema, "runs")
        )
    ).fetchall()


def _now(db: psycopg.Connection) -> datetime:
    return db.execute("SELECT clock_timestamp()").fetchone()[0]


def _most_at_once(intervals: list[tuple[datetime, datetime | None]]) -> int:
    """The most intervals open at one instant (an open one lasts until now)."""
    edges = []
    for started, ended in intervals:
        edges.append((started, 1))
        edges.append((ended or datetime.max.replace(tzinfo=started.tzinfo), -1))
    most = now = 0
    # An end and a start at the same instant: the end first.
    for _, step in sorted(edges, key=lambda edge: (edge[0], edge[1])):
        now += step
        most = max(most, now)
    return most


def _workers(
    start_worker: Callable[..., WorkerProcess], count: int, env: dict[str, str], *args: str
) -> list[WorkerProcess]:
    workers = [start_worker(*HANDLERS, *args, env=env) for _ in range(count)]
    for worker in workers:
        worker.wait_for_log("serving queue")
    return workers


def test_four_workers_never_run_more_jobs_than_the_concurrency_limit(
    queue: Queue, db, schema: str, runs: dict[str, str], start_worker
) -> None:
    queue.enqueue_many(JobSpec("record", {"sleep": 0.1}, queue="limited") for _ in range(60))
    queue.update_queue("limited", concurrency_limit=3)
    _workers(start_worker, 4, runs, "--queue", "limited", "--concurrency", "4", *FAST)

    running = sql.SQL(
        "SELECT count(*) FROM {} WHERE state = 'running' AND queue = 'limited'"
    ).format(sql.Identifier(schema, "active_jobs"))
    samples: list[int] = []
    deadline = time.monotonic() + 120
    while True:
        samples.append(db.execute(running).fetchone()[0])
        stats = {s.queue: s.counts for s in queue.stats()}["limited"]
        if stats["succeeded"] == 60 or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert stats["succeeded"] == 60
    assert max(samples) <= 3
    assert max(samples) == 3  # the limit was reached, not merely never approached
    recorded = _runs(db, schema)
    assert len(recorded) == 60
    assert _most_at_once(recorded) <= 3


def test_a_rate_limit_paces_every_worker_together(
    queue: Queue, db, schema: str, runs: dict[str, str], start_worker
) -> None:
    queue.enqueue_many(JobSpec("record", queue="rated") for _ in range(400))
    queue.update_queue("rated", rate_limit=20)
    _workers(start_worker, 2, runs, "--queue", "rated", *FAST)
    wait_for(lambda: _runs(db, schema), 60, what="the first start")
    first = _runs(db, schema)[0][0]
    wait_for(lambda: _now(db) > first + timedelta(seconds=10.5), 60, what="ten seconds")
    started = [s for s, _ in _runs(db, schema) if s < first + timedelta(seconds=10)]
    assert 180 <= len(started) <= 220  # 20/s for 10 s, within 10%


def test_a_pause_stops_starts_within_a_second_and_a_resume_restarts_them_at_once(
    queue: Queue, db, schema: str, runs: dict[str, str], start_worker
) -> None:
    queue.enqueue_many(JobSpec("record", {"sleep": 0.02}, queue="steady") for _ in range(20_000))
    queue.update_queue("steady", concurrency_limit=None)  # configured, not limited
    # The default poll interval (1 s): a prompt restart can only come from the NOTIFY.
    _workers(start_worker, 2, runs, "--queue", "steady", "--concurrency", "2")
    wait_for(lambda: len(_runs(db, schema)) > 20, 60, what="jobs to start")

    latencies = []
    for _ in range(5):
        queue.pause_queue("steady")
        paused_at = _now(db)
        time.sleep(1.5)
        late = [s for s, _ in _runs(db, schema) if s > paused_at + timedelta(seconds=1)]
        assert late == [], f"{len(late)} jobs started over a second after the pause"
        resumed_at = _now(db)
        queue.resume_queue("steady")

        def restarted(after: datetime = resumed_at) -> datetime | None:
            starts = [s for s, _ in _runs(db, schema) if s > after]
            return min(starts) if starts else None

        first = wait_for(restarted, 30, what="a start after the resume", interval=0.01)
        latencies.append((first - resumed_at).total_seconds())
        time.sleep(0.3)
    assert statistics.median(latencies) <= 0.1, latencies


def test_a_paused_queue_still_takes_enqueues_and_other_queues_run(
    queue: Queue, db, schema: str, runs: dict[str, str], start_worker
) -> None:
    queue.enqueue("record", queue="held")
    queue.pause_queue("held")
    _workers(start_worker, 1, runs, "--queue", "held", "--queue", "free", *FAST)
    queue.enqueue("record", queue="held")
    queue.enqueue("record", queue="free")
    wait_for(lambda: len(_runs(db, schema)) == 1, 60, what="the free queue's job")
    time.sleep(1.0)
    counts = {s.queue: s.counts for s in queue.stats()}
    assert counts["held"]["queued"] == 2
    queue.resume_queue("held")
    wait_for(lambda: len(_runs(db, schema)) == 3, 60, what="the held jobs")
