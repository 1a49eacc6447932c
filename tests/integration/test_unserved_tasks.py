"""The worker registry, and the queued jobs no live worker serves (an unknown task name,
a queue nobody serves), shown by Queue.unserved, ``pgqueue status`` and (see tests/api)
``/metrics``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from psycopg import sql

from pgqueue import Queue, UnservedTask, WorkerProtocol, WorkerRegistration

PGQUEUE = [str(Path(sys.executable).parent / "pgqueue")]


def _worker(worker_id: str, queues: list[str], tasks: list[str], seconds: float = 30.0):
    return WorkerRegistration(
        id=worker_id, queues=queues, tasks=tasks, concurrency=4, expiry_seconds=seconds
    )


@pytest.fixture
def stuck(queue: Queue) -> None:
    """A worker serving "send" in default; jobs of a misspelt task, of the served task,
    and of the served task in a queue nobody serves."""
    queue.register_worker(_worker("host:1:a", ["default"], ["send"]))
    for _ in range(3):
        queue.enqueue("sendmial")
    queue.enqueue("sendmial", delay_seconds=3600)  # not runnable yet, still unserved
    queue.enqueue("send")
    queue.enqueue("send", queue="nobody")


def test_unserved_counts_queued_jobs_no_live_worker_serves(queue: Queue, stuck: None) -> None:
    assert queue.unserved() == [
        UnservedTask("default", "sendmial", 4),
        UnservedTask("nobody", "send", 1),
    ]


def test_a_task_counts_no_more_once_a_worker_serving_it_registers(
    queue: Queue, stuck: None
) -> None:
    queue.register_worker(_worker("host:2:b", ["default", "other"], ["sendmial", "x"]))
    assert queue.unserved() == [UnservedTask("nobody", "send", 1)]
    # A worker that stops cleanly leaves at once.
    queue.deregister_worker("host:2:b")
    assert UnservedTask("default", "sendmial", 4) in queue.unserved()


def test_a_worker_that_died_stops_counting_when_it_expires_and_is_reaped(
    queue: Queue, stuck: None, db, schema: str
) -> None:
    protocol = WorkerProtocol(queue)
    queue.register_worker(_worker("host:3:c", ["nobody"], ["send"], seconds=0.3))
    assert [w.id for w in queue.workers()] == ["host:1:a", "host:3:c"]
    assert UnservedTask("nobody", "send", 1) not in queue.unserved()
    time.sleep(0.4)
    assert [w.id for w in queue.workers()] == ["host:1:a"]
    assert UnservedTask("nobody", "send", 1) in queue.unserved()
    protocol.reap()
    table = sql.Identifier(schema, "workers")
    rows = db.execute(sql.SQL("SELECT id FROM {}").format(table)).fetchall()
    assert rows == [("host:1:a",)]


def test_a_heartbeat_renews_the_workers_row_and_writes_it_again_if_lost(
    queue: Queue, db, schema: str
) -> None:
    protocol = WorkerProtocol(queue)
    me = _worker("host:4:d", ["default"], ["t"], seconds=0.5)
    queue.register_worker(me)
    [before] = queue.workers()
    time.sleep(0.1)
    assert protocol.heartbeat([], worker=me) == set()  # an idle worker beats too
    [after] = queue.workers()
    assert after.last_seen_at > before.last_seen_at
    assert after.started_at == before.started_at
    db.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(schema, "workers")))
    protocol.heartbeat([], worker=me)
    [again] = queue.workers()
    assert (again.id, again.queues, again.tasks, again.concurrency) == (
        "host:4:d",
        ["default"],
        ["t"],
        4,
    )


def test_workers_show_how_many_jobs_each_holds(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    queue.register_worker(_worker("host:5:e", ["default"], ["t"]))
    for _ in range(3):
        queue.enqueue("t")
    protocol.claim(["default"], ["t"], limit=2, worker_id="host:5:e")
    [info] = queue.workers()
    assert info.running == 2
    assert info.pid > 0 and info.host and info.version


def test_stats_carry_the_unserved_tasks_per_queue(queue: Queue, stuck: None) -> None:
    stats = {s.queue: s for s in queue.stats()}
    assert stats["default"].unserved == {"sendmial": 4}
    assert stats["nobody"].unserved == {"send": 1}
    snapshot = queue.metrics_snapshot()
    assert [(u.queue, u.task, u.jobs) for u in snapshot.unserved] == [
        ("default", "sendmial", 4),
        ("nobody", "send", 1),
    ]
    assert snapshot.workers == {"default": 1}


def test_unserved_tasks_names_the_pairs_no_worker_serves(queue: Queue, stuck: None) -> None:
    assert queue.unserved_tasks([("default", "send"), ("default", "x"), ("q", "send")]) == [
        ("default", "x"),
        ("q", "send"),
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
    assert table["default"][-1] == "4" and table["nobody"][-1] == "1"
    notes = [line for line in lines if line.startswith("unserved:")]
    assert len(notes) == 2
    assert "4 'sendmial' jobs in queue 'default'" in notes[0]

    out = subprocess.run(
        [*PGQUEUE, "status", "--json", *db], capture_output=True, text=True, timeout=60
    )
    assert {s["queue"]: s["unserved"] for s in json.loads(out.stdout)} == {
        "default": {"sendmial": 4},
        "nobody": {"send": 1},
    }


def test_nothing_is_unserved_when_every_task_is_served(queue: Queue) -> None:
    queue.enqueue("send")
    queue.enqueue("send")
    assert queue.unserved() == [UnservedTask("default", "send", 2)]
    queue.register_worker(_worker("host:6:f", ["default"], ["send"]))
    assert queue.unserved() == []


def _lose_unlogged_tables(db, schema: str) -> None:
    """What crash recovery, or promoting a standby, does to the schema: every unlogged
    table comes back empty."""
    names = db.execute(
        "SELECT c.relname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relkind = 'r' AND c.relpersistence = 'u'",
        (schema,),
    ).fetchall()
    assert ("workers",) in names
    for (name,) in names:
        db.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(schema, name)))


def test_a_lost_registry_names_no_task_until_every_live_worker_could_write_again(
    queue: Queue, db, schema: str
) -> None:
    me = _worker("host:6:f", ["default"], ["send"])
    queue.register_worker(me)
    assert queue.unserved_tasks([("default", "send"), ("default", "typo")]) == [("default", "typo")]

    _lose_unlogged_tables(db, schema)
    # Neither task can be said unserved: the worker has not had time to beat again.
    assert queue.unserved_tasks([("default", "send"), ("default", "typo")]) == []
    WorkerProtocol(queue).heartbeat([], worker=me)
    assert queue.unserved_tasks([("default", "send"), ("default", "typo")]) == []

    # A worker's expiry later (30 s by default), every live worker has written its row.
    db.execute(
        sql.SQL("UPDATE {} SET since = since - interval '31 seconds'").format(
            sql.Identifier(schema, "workers_kept_since")
        )
    )
    assert queue.unserved_tasks([("default", "send"), ("default", "typo")]) == [("default", "typo")]


def test_the_wait_after_a_loss_is_the_longest_expiry_of_the_workers_back(
    queue: Queue, db, schema: str
) -> None:
    _lose_unlogged_tables(db, schema)
    slow = _worker("host:7:g", ["default"], ["send"], seconds=600.0)
    queue.register_worker(slow)
    db.execute(
        sql.SQL("UPDATE {} SET since = since - interval '31 seconds'").format(
            sql.Identifier(schema, "workers_kept_since")
        )
    )
    # A worker that beats every 200 s may not be back yet.
    assert queue.unserved_tasks([("default", "typo")]) == []
    db.execute(
        sql.SQL("UPDATE {} SET since = since - interval '600 seconds'").format(
            sql.Identifier(schema, "workers_kept_since")
        )
    )
    assert queue.unserved_tasks([("default", "typo")]) == [("default", "typo")]
