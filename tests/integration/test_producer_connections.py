"""A Queue that owns its pool lets producers keep a connection between enqueues (see
pgqueue.producer_connections), without changing what anyone else sees: the Queue's
other statements and a WorkerProtocol made from it still get connections, ``conn=``
still enqueues in the caller's transaction, a connection the server closed is
replaced, and closing the Queue closes every connection."""

from __future__ import annotations

import threading
import uuid

import psycopg
import pytest
from polling import wait_for
from psycopg.conninfo import make_conninfo

from pgqueue import DatabaseUnavailable, JobSpec, Queue, WorkerProtocol


@pytest.fixture
def app_name() -> str:
    """An application_name of this test's own, to find its connections by."""
    return f"producers-{uuid.uuid4().hex[:8]}"


def backends(db: psycopg.Connection, app_name: str) -> list[int]:
    """The server processes of the connections named ``app_name``."""
    rows = db.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app_name,)
    ).fetchall()
    return [pid for (pid,) in rows]


def job_count(db: psycopg.Connection, schema: str) -> int:
    row = db.execute(f'SELECT count(*) FROM "{schema}".jobs').fetchone()
    assert row is not None
    return int(row[0])


def test_a_producer_takes_one_connection_from_the_pool_for_many_enqueues(
    database_url: str, schema: str, db: psycopg.Connection
) -> None:
    with Queue.connect(database_url, schema=schema, max_size=2) as queue:
        ids = [queue.enqueue("t", {"n": n}).job.id for n in range(20)]
        ids += [r.job.id for r in queue.enqueue_many([JobSpec("t", {"n": n}) for n in range(3)])]
        assert queue.pool.get_stats()["requests_num"] == 1
        assert len(set(ids)) == 23
    assert job_count(db, schema) == 23


def test_the_queues_other_statements_and_its_worker_get_the_kept_connection(
    database_url: str, schema: str
) -> None:
    # One connection in the pool, kept by the producer after its enqueue: anything
    # else the Queue runs must still get it, well within the pool's timeout.
    with Queue.connect(database_url, schema=schema, max_size=1, pool_timeout=2) as queue:
        job = queue.enqueue("t", {"n": 1}).job
        assert queue.get(job.id).state.value == "queued"
        queue.enqueue("t", {"n": 2})
        claimed = WorkerProtocol(queue).claim(["default"], ["t"], limit=2)
        assert sorted(j.payload["n"] for j in claimed) == [1, 2]
        queue.enqueue("t", {"n": 3})


def test_more_producer_threads_than_connections_all_get_their_turn(
    database_url: str, schema: str, db: psycopg.Connection
) -> None:
    failures: list[BaseException] = []

    def produce(queue: Queue, thread: int) -> None:
        try:
            for n in range(25):
                queue.enqueue("t", {"thread": thread, "n": n})
        except BaseException as exc:
            failures.append(exc)

    with Queue.connect(database_url, schema=schema, max_size=2, pool_timeout=10) as queue:
        threads = [threading.Thread(target=produce, args=(queue, t)) for t in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not failures
        # The threads have ended; the connections they kept serve the Queue still.
        assert queue.list(limit=1).jobs
    assert job_count(db, schema) == 150


def test_the_callers_connection_is_used_and_left_as_it_was(
    database_url: str, schema: str, db: psycopg.Connection
) -> None:
    with (
        Queue.connect(database_url, schema=schema, max_size=1) as queue,
        psycopg.connect(database_url) as own,
    ):
        queue.enqueue("t", {"n": 1}, conn=own)
        queue.enqueue_many([JobSpec("t", {"n": 2})], conn=own)
        own.rollback()
        assert job_count(db, schema) == 0
        queue.enqueue("t", {"n": 3}, conn=own)
        own.commit()
        assert job_count(db, schema) == 1
        # The pool was never asked for a connection.
        assert queue.pool.get_stats().get("requests_num", 0) == 0


def test_a_kept_connection_the_server_closed_is_replaced(
    database_url: str, schema: str, db: psycopg.Connection, app_name: str
) -> None:
    url = make_conninfo(database_url, application_name=app_name)
    with Queue.connect(url, schema=schema, max_size=1) as queue:
        queue.enqueue("t", {"n": 1})
        [kept] = backends(db, app_name)
        # What a server restart does to every connection: its backend ends.
        db.execute("SELECT pg_terminate_backend(%s)", (kept,))
        wait_for(lambda: kept not in backends(db, app_name), 30, "the backend to end")
        with pytest.raises(DatabaseUnavailable):
            queue.enqueue("t", {"n": 2})
        queue.enqueue("t", {"n": 3})
        assert kept not in backends(db, app_name)
    payloads = db.execute(f'SELECT payload FROM "{schema}".jobs ORDER BY id').fetchall()
    assert [p["n"] for (p,) in payloads] == [1, 3]


def test_closing_the_queue_closes_the_connections_producers_keep(
    database_url: str, schema: str, db: psycopg.Connection, app_name: str
) -> None:
    url = make_conninfo(database_url, application_name=app_name)
    queue = Queue.connect(url, schema=schema, min_size=1, max_size=4)
    started = threading.Barrier(4)

    def produce() -> None:
        started.wait(30)
        for n in range(10):
            queue.enqueue("t", {"n": n})

    threads = [threading.Thread(target=produce) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert backends(db, app_name)
    queue.close()
    wait_for(lambda: not backends(db, app_name), 30, "every connection to close")
    with pytest.raises(DatabaseUnavailable):
        queue.enqueue("t", {"n": 99})
