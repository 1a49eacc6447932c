"""Large keyless batches of enqueue_many go through COPY (pgqueue.bulk): the jobs they
return must be exactly what the table holds, on the database's clock, in the caller's
transaction when there is one, and waiting workers must be woken as by an INSERT."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from pgqueue import JobSpec, Queue, Waiter, WorkerProtocol
from pgqueue.bulk import COPY_MIN_JOBS


def _count(db: psycopg.Connection, schema: str) -> int:
    return db.execute(f"SELECT count(*) FROM {schema}.jobs").fetchone()[0]


def test_a_copied_batch_returns_the_jobs_the_table_holds_in_input_order(queue: Queue) -> None:
    moment = datetime(2031, 5, 1, 12, tzinfo=UTC)
    specs = [
        JobSpec("echo", {"i": i}, queue=f"q{i % 3}", priority=i % 5, timeout_seconds=2.5)
        for i in range(COPY_MIN_JOBS)
    ]
    specs[1] = JobSpec("echo", {"i": 1}, delay_seconds=60)
    specs[2] = JobSpec("echo", {"i": 2}, run_at=moment, max_attempts=9)
    results = queue.enqueue_many(specs)

    assert all(result.created for result in results)
    ids = [result.job.id for result in results]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for result in results:
        assert queue.get(result.job.id) == result.job
    first = results[0].job
    assert first.run_at == first.enqueued_at  # the database's clock, as an INSERT sets it
    assert results[1].job.run_at - results[1].job.enqueued_at == timedelta(seconds=60)
    assert (results[2].job.run_at, results[2].job.max_attempts) == (moment, 9)


def test_a_copied_batch_runnable_now_runs_at_its_transactions_clock(
    queue: Queue, database_url: str
) -> None:
    # No job is delayed, so no row carries a run_at (job_copy_runnable_now): the column
    # default must give each the clock of the caller's transaction, which began earlier,
    # and the jobs returned must say so.
    with psycopg.connect(database_url) as conn:
        began = conn.execute("SELECT now()").fetchone()[0]
        conn.execute("SELECT pg_sleep(0.05)")
        results = queue.enqueue_many(
            [JobSpec("echo", {"i": i}, priority=i % 3) for i in range(COPY_MIN_JOBS)], conn=conn
        )
        conn.commit()
    assert {(result.job.run_at, result.job.enqueued_at) for result in results} == {(began, began)}
    for result in results:
        assert queue.get(result.job.id) == result.job


@pytest.mark.parametrize("commit", [True, False])
def test_a_copied_batch_follows_the_callers_transaction(
    queue: Queue, database_url: str, schema: str, db: psycopg.Connection, commit: bool
) -> None:
    with psycopg.connect(database_url) as conn:
        queue.enqueue_many([JobSpec("bill", {"n": n}) for n in range(COPY_MIN_JOBS)], conn=conn)
        assert _count(db, schema) == 0  # nobody else sees them before the commit
        conn.commit() if commit else conn.rollback()
    assert _count(db, schema) == (COPY_MIN_JOBS if commit else 0)


def test_a_copied_batch_on_an_autocommit_connection_is_all_or_nothing(
    queue: Queue, database_url: str, schema: str, db: psycopg.Connection, refuse_poison: None
) -> None:
    specs = [JobSpec("good") for _ in range(COPY_MIN_JOBS)] + [JobSpec("poison")]
    with psycopg.connect(database_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.RaiseException, match="poison row"):
            queue.enqueue_many(specs, conn=conn)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with pytest.raises(psycopg.errors.RaiseException, match="poison row"):
        queue.enqueue_many(specs)
    assert _count(db, schema) == 0


def test_a_copied_batch_wakes_only_the_queues_where_a_worker_waits(
    queue: Queue, database_url: str
) -> None:
    protocol = WorkerProtocol(queue)
    with psycopg.connect(database_url, autocommit=True) as listener:
        protocol.listen(listener)
        assert protocol.claim(["mail"], ["echo"], waiter=Waiter("w/0", 30.0)) == []
        queue.enqueue_many(
            [JobSpec("echo", queue="mail" if n % 2 else "sms") for n in range(COPY_MIN_JOBS)]
        )
        notes = [n.payload for n in listener.notifies(timeout=2, stop_after=5)]
    assert notes == ["mail"]
