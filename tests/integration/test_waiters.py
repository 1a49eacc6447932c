"""Enqueues notify only the queues where a worker waits: a LISTENing claimer whose last
claim came back short, until its next claim or its record expires."""

from __future__ import annotations

import time

import psycopg
from psycopg import sql

from pgqueue import Queue, Waiter, WorkerProtocol


def _notified(listener: psycopg.Connection, wait: float = 0.3) -> list[str]:
    return [n.payload for n in listener.notifies(timeout=wait, stop_after=10)]


def _waiter_rows(db: psycopg.Connection, schema: str) -> list[tuple[str, str]]:
    return db.execute(
        sql.SQL("SELECT queue, waiter FROM {} ORDER BY queue").format(
            sql.Identifier(schema, "queue_waiters")
        )
    ).fetchall()


def test_only_queues_with_a_waiter_are_notified(
    queue: Queue, database_url: str, db, schema: str
) -> None:
    protocol = WorkerProtocol(queue)
    with psycopg.connect(database_url, autocommit=True) as listener:
        protocol.listen(listener)
        waiter = Waiter("w1/0", 30.0)

        queue.enqueue("t", queue="mail")
        assert _notified(listener) == []  # nobody waits

        # mail has a job: a claim of 2 comes back short; the worker waits on both queues.
        assert len(protocol.claim(["mail", "sms"], ["t"], limit=2, waiter=waiter)) == 1
        assert _waiter_rows(db, schema) == [("mail", "w1/0"), ("sms", "w1/0")]
        queue.enqueue("t", queue="mail")
        queue.enqueue("t", queue="push")
        assert _notified(listener) == ["mail"]

        # A full claim: the worker is busy, nothing waits, nothing is notified.
        assert len(protocol.claim(["mail", "sms"], ["t"], limit=1, waiter=waiter)) == 1
        assert _waiter_rows(db, schema) == []
        queue.enqueue("t", queue="sms")
        assert _notified(listener) == []


def test_a_waiter_that_stops_claiming_expires_and_the_reaper_removes_it(
    queue: Queue, database_url: str, db, schema: str
) -> None:
    protocol = WorkerProtocol(queue)
    with psycopg.connect(database_url, autocommit=True) as listener:
        protocol.listen(listener)
        protocol.claim(["mail"], ["t"], waiter=Waiter("gone/0", 0.2))
        time.sleep(0.3)
        queue.enqueue("t", queue="mail")
        assert _notified(listener) == []
        assert protocol.reap() == []
        assert _waiter_rows(db, schema) == []


def test_a_worker_that_stops_forgets_its_waiters(queue: Queue, db, schema: str) -> None:
    protocol = WorkerProtocol(queue)
    first, second = Waiter("w/0", 30.0), Waiter("w/1", 30.0)
    protocol.claim(["mail"], ["t"], waiter=first)
    protocol.claim(["mail"], ["u"], waiter=second)
    protocol.claim(["mail"], ["t"], waiter=Waiter("other/0", 30.0))
    protocol.forget_waiters([first, second])
    assert _waiter_rows(db, schema) == [("mail", "other/0")]
