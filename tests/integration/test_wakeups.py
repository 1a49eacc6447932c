"""Enqueues notify a queue only while a worker waits on it (migration 0007).

A LISTEN connection of the test's own plays the worker's listener; claims with and
without a ``waiter`` play the worker's claims."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from pgqueue import Queue


@pytest.fixture
def listener(database_url: str, queue: Queue) -> Iterator[psycopg.Connection]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        queue.listen(conn)
        yield conn


def notified(conn: psycopg.Connection, timeout: float = 0.5) -> list[str]:
    """The queue names notified within ``timeout`` seconds."""
    return [n.payload for n in conn.notifies(timeout=timeout, stop_after=10)]


def waiting(db: psycopg.Connection, schema: str) -> set[tuple[str, str]]:
    return set(db.execute(f"SELECT queue, waiter FROM {schema}.waiting_workers").fetchall())


def test_with_nobody_waiting_an_enqueue_notifies_nobody(queue: Queue, listener) -> None:
    queue.enqueue("t")
    queue.enqueue_many([])
    assert notified(listener) == []
    # A claim without a waiter records nothing either.
    queue.claim(["default"], ["t"], 5)
    queue.enqueue("t")
    assert notified(listener) == []


def test_a_short_claim_makes_its_queues_notify(queue: Queue, listener, db) -> None:
    assert queue.claim(["default", "mail"], ["t"], 5, waiter="w1/plain") == []
    assert waiting(db, queue.schema) == {("default", "w1/plain"), ("mail", "w1/plain")}
    queue.enqueue("t", queue="mail")
    queue.enqueue("t", queue="other")
    assert notified(listener) == ["mail"]


def test_a_full_claim_takes_the_record_back(queue: Queue, listener, db) -> None:
    queue.claim(["default"], ["t"], 2, waiter="w1/plain")  # short: waits
    for _ in range(2):
        queue.enqueue("t")
    assert notified(listener) == ["default", "default"]
    assert len(queue.claim(["default"], ["t"], 2, waiter="w1/plain")) == 2  # full: busy
    assert waiting(db, queue.schema) == set()
    queue.enqueue("t")
    assert notified(listener) == []


def test_each_waiter_has_its_own_record(queue: Queue, listener, db) -> None:
    queue.claim(["default"], ["t"], 5, waiter="w1/plain")
    queue.enqueue("t")
    assert notified(listener) == ["default"]
    # Another waiter's full claim leaves w1's record alone.
    assert len(queue.claim(["default"], ["t"], 1, waiter="w2/async")) == 1
    assert waiting(db, queue.schema) == {("default", "w1/plain")}
    queue.enqueue("t")
    assert notified(listener) == ["default"]


def test_an_expired_record_notifies_no_more_and_the_reaper_removes_it(
    queue: Queue, listener, db
) -> None:
    queue.claim(["default"], ["t"], 5, waiter="gone/plain", waiting_seconds=0.2)
    time.sleep(0.4)  # the record's lifetime, on the database clock, is over
    queue.enqueue("t")
    assert notified(listener) == []
    assert queue.reap() == []
    assert waiting(db, queue.schema) == set()


def test_forget_waiters_takes_the_records_back(queue: Queue, listener, db) -> None:
    queue.claim(["default"], ["t"], 5, waiter="w1/plain")
    queue.claim(["default"], ["t"], 5, waiter="w1/async")
    queue.forget_waiters(["w1/plain", "w1/async"])
    assert waiting(db, queue.schema) == set()
    queue.enqueue("t")
    assert notified(listener) == []


def test_ack_and_claim_records_waiting_as_claim_does(queue: Queue, listener, db) -> None:
    queue.enqueue("t")
    [job] = queue.claim(["default"], ["t"])
    batch, claimed = queue.ack_and_claim([(job, None)], ["default"], ["t"], 5, waiter="w1/plain")
    assert claimed == [] and len(batch.succeeded) == 1
    assert waiting(db, queue.schema) == {("default", "w1/plain")}
