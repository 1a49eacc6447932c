"""Statement deadlines: a statement that overruns has its connection cut off, fails,
and leaves nothing locked; one that finishes in time is never touched again."""

from __future__ import annotations

import time

import psycopg
import pytest
from polling import wait_for

from pgqueue import DatabaseUnavailable, JobState, Queue, WorkerProtocol
from pgqueue.deadlines import WATCHDOG, DeadlineExceeded

pytestmark = pytest.mark.timeout(120)


def backends(db: psycopg.Connection, application_name: str) -> int:
    return db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [application_name]
    ).fetchone()[0]


def test_an_overrunning_statement_is_cut_off_and_its_session_ends(
    database_url: str, db: psycopg.Connection
) -> None:
    conn = psycopg.connect(database_url, application_name="deadline-overrun")
    with pytest.raises(DeadlineExceeded) as raised, WATCHDOG.watch(conn, 0.5, "a long sleep"):
        conn.execute("SELECT pg_sleep(60)")
    # pg_sleep(60) raises nothing by itself: the error is the cut-off's.
    assert str(raised.value).startswith("a long sleep took longer than 0.5 s")
    with pytest.raises(psycopg.OperationalError):
        conn.execute("SELECT 1")  # its socket is gone
    wait_for(lambda: backends(db, "deadline-overrun") == 0, 30, "the server session to end")


def test_a_statement_in_time_leaves_its_connection_alone(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        with WATCHDOG.watch(conn, 0.3, "a quick query"):
            conn.execute("SELECT 1")
        time.sleep(0.6)  # well past the deadline the block no longer has
        assert conn.execute("SELECT 2").fetchone() == (2,)
        assert not conn.broken


def test_a_queue_call_over_its_statement_timeout_fails_and_rolls_back(
    queue: Queue, database_url: str
) -> None:
    protocol = WorkerProtocol(queue)
    queue.enqueue("t")
    [job] = protocol.claim(["default"], ["t"])
    bounded = queue.with_statement_timeout(1.0)
    bounded_protocol = WorkerProtocol(bounded)
    with psycopg.connect(database_url) as locker:
        # Another transaction holds the job's row: the ack waits for it, and overruns.
        locker.execute(
            f"SELECT 1 FROM {queue.schema}.active_jobs WHERE id = %s FOR UPDATE", [job.id]
        )
        with pytest.raises(DatabaseUnavailable, match="took longer than 1 s"):
            bounded_protocol.ack(job, {"n": 1})
    # The cut-off ack wrote nothing, and the same ack goes through once the row is free.
    assert queue.get(job.id).state is JobState.RUNNING
    assert bounded_protocol.ack(job, {"n": 1}).state is JobState.SUCCEEDED
    assert queue.statement_timeout is None  # the original is unbounded still
