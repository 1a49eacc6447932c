"""Every ``pgqueue worker`` is in the worker registry while it runs: it registers when it
starts, its heartbeat keeps its row fresh even while idle, it leaves when it stops
cleanly, and one that is killed drops out when its row expires and the reaper removes
it. ``pgqueue workers`` lists them."""

from __future__ import annotations

import json
import signal
import subprocess
import time

from polling import wait_for
from processes import pgqueue_command
from psycopg import sql
from worker_support import FAST

from pgqueue import Queue, WorkerProtocol


def test_a_worker_registers_beats_while_idle_and_leaves_when_it_stops(
    queue: Queue, start_worker, database_url: str, schema: str
) -> None:
    worker = start_worker("--queue", "mail", "--queue", "sms", "--concurrency", "3", *FAST)
    worker.wait_for_log("serving queue")
    [info] = wait_for(queue.workers, 30, what="the worker's registration")
    assert info.pid == worker.pid
    assert info.queues == ["mail", "sms"]
    assert "echo" in info.tasks
    assert info.concurrency >= 3
    first_seen = info.last_seen_at
    # Idle, the worker still renews its row with each heartbeat (0.25 s here).
    wait_for(lambda: queue.workers()[0].last_seen_at > first_seen, 10, what="a heartbeat")

    listed = subprocess.run(
        [*pgqueue_command(), "workers", "--database-url", database_url, "--schema", schema],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split() == ["id", "host", "pid", "queues", "tasks", "running", "last", "seen"]
    assert row.split()[0] == info.id and row.split()[3] == "mail,sms"
    as_json = subprocess.run(
        [
            *pgqueue_command(),
            "workers",
            "--json",
            "--database-url",
            database_url,
            "--schema",
            schema,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert [w["pid"] for w in json.loads(as_json.stdout)] == [worker.pid]

    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert queue.workers() == []


def test_a_killed_worker_expires_and_the_reaper_removes_its_row(
    queue: Queue, start_worker, db, schema: str
) -> None:
    protocol = WorkerProtocol(queue)
    worker = start_worker(*FAST)
    worker.wait_for_log("serving queue")
    wait_for(queue.workers, 30, what="the worker's registration")
    worker.signal(signal.SIGKILL)
    worker.wait()
    # Three heartbeat intervals (0.75 s here) without a beat.
    started = time.monotonic()
    wait_for(lambda: queue.workers() == [], 10, what="the row to expire")
    assert time.monotonic() - started < 5
    protocol.reap()
    rows = db.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "workers")))
    assert rows.fetchone()[0] == 0
