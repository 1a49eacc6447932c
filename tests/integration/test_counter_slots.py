"""The statements that count finished jobs never wait for another transaction's counter
row: two backends whose pids share a slot (pid modulo 16) once deadlocked, one holding
the slot's row while it waited for a job, the other holding that job while it counted."""

import threading
from collections.abc import Iterator

import psycopg
import pytest

from pgqueue import JobState, Queue, queries


@pytest.fixture
def same_slot_pair(database_url: str) -> Iterator[tuple[psycopg.Connection, psycopg.Connection]]:
    """Two connections whose backend pids are equal modulo 16, the slot each used to
    count in: among 17 connections two always are."""
    opened: list[psycopg.Connection] = []
    by_slot: dict[int, psycopg.Connection] = {}
    try:
        for _ in range(17):
            conn = psycopg.connect(database_url)
            opened.append(conn)
            slot = conn.info.backend_pid % 16
            if slot in by_slot:
                yield by_slot[slot], conn
                return
            by_slot[slot] = conn
        raise AssertionError("17 backends, yet no two pids equal modulo 16")
    finally:
        for conn in opened:
            conn.close()


def _cancelled(queue: Queue) -> int:
    """The default queue's cancelled jobs, as the counters have them."""
    (stats,) = (entry for entry in queue.stats() if entry.queue == "default")
    return stats.counts["cancelled"]


def _cancel(conn: psycopg.Connection, schema: str, job_id: int) -> None:
    conn.execute(queries.bind("job_cancel", schema), {"id": job_id})


def test_two_transactions_sharing_a_pid_slot_count_without_waiting(
    queue: Queue, schema: str, same_slot_pair
) -> None:
    first, second = same_slot_pair
    one, two = (queue.enqueue("t").job.id for _ in range(2))
    _cancel(first, schema, one)  # first holds a counter row, its transaction open
    second.execute("SET lock_timeout = '5s'")
    _cancel(second, schema, two)  # counted in another slot: no wait for first
    second.commit()
    first.commit()
    assert queue.get(one).state is JobState.CANCELLED
    assert queue.get(two).state is JobState.CANCELLED
    assert _cancelled(queue) == 2


def test_a_counted_transaction_waiting_for_a_job_held_by_one_about_to_count_is_no_deadlock(
    queue: Queue, schema: str, same_slot_pair
) -> None:
    """The deadlock as it happened: ``first`` has counted (an operator's cancel) and waits
    for a job that ``second`` holds (a worker writing its outcome), and ``second`` then
    counts a job of its own."""
    first, second = same_slot_pair
    counted_first, held, counted_second = (queue.enqueue("t").job.id for _ in range(3))
    _cancel(first, schema, counted_first)
    second.execute(
        psycopg.sql.SQL("SELECT FROM {}.active_jobs WHERE id = %s FOR UPDATE").format(
            psycopg.sql.Identifier(schema)
        ),
        (held,),
    )
    failures: list[BaseException] = []

    def cancel_the_held_job() -> None:
        try:
            _cancel(first, schema, held)
            first.commit()
        except BaseException as error:  # reported by the assertion below
            failures.append(error)
            first.rollback()

    waiting = threading.Thread(target=cancel_the_held_job)
    waiting.start()
    try:
        # first is now waiting for second's row lock (deadlock_timeout is 1 s by
        # default: a circle would be found and broken well within the 10 s below).
        second.execute("SET lock_timeout = '10s'")
        _cancel(second, schema, counted_second)
        second.commit()
    finally:
        waiting.join(timeout=30)
    assert not waiting.is_alive()
    assert failures == []
    for job_id in (counted_first, held, counted_second):
        assert queue.get(job_id).state is JobState.CANCELLED
    assert _cancelled(queue) == 3
