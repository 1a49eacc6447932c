"""Queued jobs that no worker takes (an unknown task name, a queue nobody serves) are
shown by Queue.unserved, ``pgqueue status`` and (see tests/api) ``/metrics``."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from psycopg import sql

from pgqueue import Queue
from pgqueue.queue import UNSERVED_AFTER_SECONDS, UnservedTask

PGQUEUE = [str(Path(sys.executable).parent / "pgqueue")]


def _waited(minutes: float) -> datetime:
    """A run_at that makes a job runnable for ``minutes`` already."""
    return datetime.now(UTC) - timedelta(minutes=minutes)


def _enqueue_waiting(jobs: Queue, db, schema: str, task: str, minutes: float, **options):
    """A job runnable, and in the table, for ``minutes`` already."""
    job = jobs.enqueue(task, run_at=_waited(minutes), **options).job
    db.execute(
        sql.SQL("UPDATE {}.active_jobs SET enqueued_at = run_at WHERE id = %s").format(
            sql.Identifier(schema)
        ),
        (job.id,),
    )
    return job


@pytest.fixture
def stuck(queue: Queue, db, schema: str) -> None:
    """Jobs of a misspelt task waiting for an hour, and of a served task, one of which
    runs; jobs not runnable long enough or not at all; a job of the served task in a
    queue nobody serves."""
    for _ in range(3):
        _enqueue_waiting(queue, db, schema, "sendmial", 60)
    _enqueue_waiting(queue, db, schema, "send", 60)
    _enqueue_waiting(queue, db, schema, "send", 60)
    queue.claim(["default"], ["send"], limit=1)  # a worker serves "send"
    _enqueue_waiting(queue, db, schema, "sendmial", 1)  # not for long enough yet
    queue.enqueue("sendmial", delay_seconds=3600)  # not runnable
    queue.enqueue("sendmial", run_at=_waited(60))  # only just enqueued
    _enqueue_waiting(queue, db, schema, "send", 60, queue="nobody")


def test_unserved_counts_long_runnable_jobs_of_tasks_with_no_job_running(
    queue: Queue, stuck: None
) -> None:
    assert UNSERVED_AFTER_SECONDS == 300
    assert queue.unserved() == [
        UnservedTask("default", "sendmial", 3),
        UnservedTask("nobody", "send", 1),
    ]
    # With no wait required, the recent ones count too.
    assert UnservedTask("default", "sendmial", 5) in queue.unserved(after_seconds=0)


def test_a_task_counts_no_more_once_a_worker_runs_it(queue: Queue, stuck: None) -> None:
    queue.claim(["default"], ["sendmial"], limit=1)
    assert queue.unserved() == [UnservedTask("nobody", "send", 1)]


def test_stats_carry_the_unserved_tasks_per_queue(queue: Queue, stuck: None) -> None:
    stats = {s.queue: s for s in queue.stats()}
    assert stats["default"].unserved == {"sendmial": 3}
    assert stats["nobody"].unserved == {"send": 1}
    snapshot = queue.metrics_snapshot()
    assert [(u.queue, u.task, u.jobs) for u in snapshot.unserved] == [
        ("default", "sendmial", 3),
        ("nobody", "send", 1),
    ]


def test_pgqueue_status_shows_unserved_jobs_and_their_tasks(
    queue: Queue, stuck: None, database_url: str, schema: str
) -> None:
    db = ["--database-url", database_url, "--schema", schema]
    out = subprocess.run([*PGQUEUE, "status", *db], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[-1] == "unserved"
    table = {line.split()[0]: line.split() for line in lines[1:3]}
    assert table["default"][-1] == "3" and table["nobody"][-1] == "1"
    notes = [line for line in lines if line.startswith("unserved:")]
    assert len(notes) == 2
    assert "3 'sendmial' jobs in queue 'default'" in notes[0]

    out = subprocess.run(
        [*PGQUEUE, "status", "--json", *db], capture_output=True, text=True, timeout=60
    )
    assert {s["queue"]: s["unserved"] for s in json.loads(out.stdout)} == {
        "default": {"sendmial": 3},
        "nobody": {"send": 1},
    }


def test_nothing_is_unserved_when_every_task_is_served(queue: Queue, db, schema) -> None:
    _enqueue_waiting(queue, db, schema, "send", 60)
    _enqueue_waiting(queue, db, schema, "send", 60)
    assert queue.unserved() == [UnservedTask("default", "send", 2)]
    queue.claim(["default"], ["send"], limit=1)
    assert queue.unserved() == []
