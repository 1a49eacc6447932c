"""Enqueue: validation, idempotency (also under a race), bulk and transactional enqueue."""

import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from pgqueue import JobSpec, JobState, Queue, ValidationError, Waiter, WorkerProtocol


def test_enqueue_stores_the_job_with_database_timestamps(queue):
    outcome = queue.enqueue("echo", {"n": 1}, queue="mail", priority=5, max_attempts=3)
    job = outcome.job
    assert outcome.created
    assert (job.task, job.queue, job.payload, job.priority) == ("echo", "mail", {"n": 1}, 5)
    assert job.state is JobState.QUEUED and job.attempts == 0 and job.max_attempts == 3
    assert job.run_at == job.enqueued_at
    assert queue.get(job.id) == job


def test_delay_and_run_at_set_when_the_job_becomes_runnable(queue):
    delayed = queue.enqueue("echo", delay_seconds=60).job
    assert delayed.run_at - delayed.enqueued_at == timedelta(seconds=60)
    moment = datetime(2031, 5, 1, 12, tzinfo=UTC)
    assert queue.enqueue("echo", run_at=moment).job.run_at == moment


def test_a_duplicate_idempotency_key_returns_the_existing_job_whatever_its_options(queue):
    first = queue.enqueue("echo", {"v": 1}, idempotency_key="order-1")
    # The same job asked for again, with other scheduling options: still the same job.
    again = queue.enqueue("echo", {"v": 1}, idempotency_key="order-1", priority=9, delay_seconds=60)
    assert first.created and not again.created
    assert again.job.id == first.job.id and again.job.priority == 0


def test_ten_racing_producers_with_one_key_make_one_row(queue, schema, db):
    barrier = threading.Barrier(10)
    outcomes = []

    def produce(i: int) -> None:
        barrier.wait()
        outcomes.append(queue.enqueue("echo", {"order": 7}, idempotency_key="same"))

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(outcomes) == 10
    assert len({o.job.id for o in outcomes}) == 1
    assert sum(o.created for o in outcomes) == 1
    rows = db.execute(f"SELECT count(*) FROM {schema}.jobs WHERE idempotency_key = 'same'")
    assert rows.fetchone()[0] == 1


def test_enqueue_many_keeps_request_order_and_reports_duplicates(queue):
    existing = queue.enqueue("echo", idempotency_key="known").job
    results = queue.enqueue_many(
        [
            JobSpec("a"),
            JobSpec("echo", idempotency_key="known"),
            JobSpec("c", idempotency_key="new"),
            JobSpec("d"),
            JobSpec("c", idempotency_key="new"),
        ]
    )
    assert [r.created for r in results] == [True, False, True, True, False]
    assert results[1].job.id == existing.id
    assert results[2].job.id == results[4].job.id
    assert [r.job.task for r in results] == ["a", "echo", "c", "d", "c"]


def test_enqueue_many_returns_the_jobs_the_table_holds_in_input_order(queue):
    # Whole and fractional seconds side by side, as callers write them.
    moment = datetime(2031, 5, 1, 12, tzinfo=UTC)
    specs = [
        JobSpec("echo", {"i": 0, "text": "d\u00e9j\u00e0 \u2603"}, queue="mail", priority=3),
        JobSpec("other", {"list": [1, 2.5, None, True]}, delay_seconds=60, tags=["b", "a"]),
        JobSpec("echo", {"n": {}}, run_at=moment, max_attempts=9, timeout_seconds=2.5),
        JobSpec("echo", {"i": 3}, partition_key="tenant-1", timeout_seconds=3),
        JobSpec("echo", delay_seconds=0.5),
    ]
    results = queue.enqueue_many(specs)
    assert all(result.created for result in results)
    ids = [result.job.id for result in results]
    assert ids == sorted(ids)
    for spec, result in zip(specs, results, strict=True):
        assert (result.job.task, result.job.payload) == (spec.task, spec.payload)
        assert result.job == queue.get(result.job.id)
    first, delayed, timed = (result.job for result in results[:3])
    assert first.run_at == first.enqueued_at
    assert delayed.run_at - delayed.enqueued_at == timedelta(seconds=60)
    assert (timed.run_at, timed.max_attempts) == (moment, 9)


def test_enqueue_many_inserts_thousands_in_one_statement(queue, schema, db):
    results = queue.enqueue_many(JobSpec("echo", {"i": i}) for i in range(5000))
    assert [r.job.payload["i"] for r in results] == list(range(5000))
    assert db.execute(f"SELECT count(*) FROM {schema}.jobs").fetchone()[0] == 5000


def test_enqueue_many_is_all_or_nothing(queue, schema, db, refuse_poison):
    with pytest.raises(ValidationError):
        queue.enqueue_many([JobSpec("good"), JobSpec("bad", max_attempts=0)])
    # A failure inside the database, on the last row, rolls back the whole batch too.
    with pytest.raises(psycopg.errors.RaiseException, match="poison row"):
        queue.enqueue_many([JobSpec("good"), JobSpec("good"), JobSpec("poison")])
    assert db.execute(f"SELECT count(*) FROM {schema}.jobs").fetchone()[0] == 0


@pytest.mark.parametrize("commit", [True, False])
def test_transactional_enqueue_follows_the_callers_transaction(
    queue, database_url, schema, db, commit
):
    db.execute(f"CREATE TABLE {schema}.orders (id int)")
    with psycopg.connect(database_url) as conn:
        conn.execute(f"INSERT INTO {schema}.orders VALUES (1)")
        job = queue.enqueue("ship", {"order": 1}, conn=conn).job
        queue.enqueue_many([JobSpec("bill", {"order": 1})], conn=conn)
        # Not visible to anyone else before the caller commits.
        assert db.execute(f"SELECT count(*) FROM {schema}.jobs").fetchone()[0] == 0
        if commit:
            conn.commit()
        else:
            conn.rollback()
    jobs = db.execute(f"SELECT count(*) FROM {schema}.jobs").fetchone()[0]
    orders = db.execute(f"SELECT count(*) FROM {schema}.orders").fetchone()[0]
    assert (jobs, orders) == ((2, 1) if commit else (0, 0))
    if commit:
        assert queue.get(job.id).task == "ship"


def test_enqueue_notifies_listeners_with_the_queue_name_only(queue, database_url, schema):
    protocol = WorkerProtocol(queue)
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(f"LISTEN {schema}_jobs")
        # A worker waits on the queue: its claim came back empty.
        protocol.claim(["emails"], ["echo"], waiter=Waiter("w/0", 30.0))
        queue.enqueue("echo", {"secret": "not in the notification"}, queue="emails")
        notes = list(listener.notifies(timeout=10, stop_after=1))
    assert [n.payload for n in notes] == ["emails"]


def test_a_pruned_jobs_idempotency_key_can_be_used_again(queue):
    job = queue.enqueue("echo", idempotency_key="once").job
    queue.cancel(job.id)
    assert queue.prune(0) == 1
    again = queue.enqueue("echo", idempotency_key="once")
    assert again.created and again.job.id != job.id


def test_pool_on_unreachable_database_fails_fast_with_a_clear_error():
    from pgqueue import DatabaseUnavailable

    q = Queue.connect("postgresql://postgres@127.0.0.1:1/nowhere", pool_timeout=1)
    try:
        with pytest.raises(DatabaseUnavailable, match="database unavailable"):
            q.enqueue("echo")
    finally:
        q.close()
