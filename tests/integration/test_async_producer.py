"""pgqueue.AsyncProducer: enqueues from asyncio code, on the event loop for a job alone,
through the Queue in a thread for keys and dependencies, and always exactly what
Queue.enqueue would have stored and returned."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
import pytest

from pgqueue import AsyncProducer, DatabaseUnavailable, JobState, Queue, ValidationError
from pgqueue.validation import TooLarge

T = TypeVar("T")


def run_with_producer(queue: Queue, body: Callable[[AsyncProducer], Awaitable[T]]) -> T:
    async def main() -> T:
        producer = await AsyncProducer.open(queue, max_size=4)
        try:
            return await body(producer)
        finally:
            await producer.close()

    return asyncio.run(main())


def _count(db: psycopg.Connection, schema: str) -> int:
    return db.execute(f"SELECT count(*) FROM {schema}.jobs").fetchone()[0]


def test_a_job_alone_is_stored_and_returned_as_queue_enqueue_would(queue: Queue) -> None:
    async def body(producer: AsyncProducer) -> Any:
        return await producer.enqueue(
            "send_email", {"to": "a@example.com", "n": [1, 2.5]}, queue="mail", priority=3
        )

    result = run_with_producer(queue, body)
    assert result.created
    job = result.job
    assert (job.task, job.queue, job.priority, job.state) == (
        "send_email",
        "mail",
        3,
        JobState.QUEUED,
    )
    assert job.run_at == job.enqueued_at
    assert queue.get(job.id) == job


def test_a_job_alone_never_needs_the_queues_own_pool(
    queue: Queue, database_url: str, schema: str
) -> None:
    # With the Queue's pool closed, only the producer's own connections can add the job:
    # a fallback to Queue.enqueue_spec in a thread would fail.
    own = Queue.connect(database_url, schema=schema)

    async def body(producer: AsyncProducer) -> Any:
        own.close()
        return await producer.enqueue("t", {"n": 1})

    result = run_with_producer(own, body)
    assert result.created and queue.get(result.job.id) == result.job


def test_a_delay_and_the_options_of_a_job_alone_are_stored(queue: Queue) -> None:
    async def body(producer: AsyncProducer) -> Any:
        delayed = await producer.enqueue(
            "t", {}, delay_seconds=90, max_attempts=2, timeout_seconds=7.5
        )
        return delayed.job

    job = run_with_producer(queue, body)
    assert (job.run_at - job.enqueued_at).total_seconds() == 90
    assert (job.max_attempts, job.timeout_seconds) == (2, 7.5)
    assert queue.get(job.id) == job


def test_keys_and_dependencies_go_through_the_queue_with_the_same_answers(queue: Queue) -> None:
    first = queue.enqueue("t", {"n": 1})

    async def body(producer: AsyncProducer) -> Any:
        keyed = await producer.enqueue("t", {"n": 2}, idempotency_key="order-7")
        again = await producer.enqueue("t", {"n": 2}, idempotency_key="order-7")
        held = await producer.enqueue("t", {"n": 3}, unique_key="user-9")
        also_held = await producer.enqueue("t", {"n": 4}, unique_key="user-9")
        waiting = await producer.enqueue("t", {"n": 5}, depends_on=[first.job.id])
        return keyed, again, held, also_held, waiting

    keyed, again, held, also_held, waiting = run_with_producer(queue, body)
    assert (keyed.created, again.created, again.job.id) == (True, False, keyed.job.id)
    assert (held.created, also_held.created, also_held.job.id) == (True, False, held.job.id)
    assert waiting.job.state is JobState.WAITING
    for result in (keyed, held, waiting):
        assert queue.get(result.job.id) == result.job


def test_refused_jobs_add_nothing(queue: Queue, db: psycopg.Connection, schema: str) -> None:
    small = Queue(queue.pool, schema=schema, max_payload_bytes=64)

    async def body(producer: AsyncProducer) -> list[Exception]:
        refused = []
        for call in (
            lambda: producer.enqueue("bad name", {}),
            lambda: producer.enqueue("t", {"text": "x" * 100}),
            lambda: producer.enqueue("t", {"nul": "\x00"}),
        ):
            with pytest.raises(ValidationError) as info:
                await call()
            refused.append(info.value)
        return refused

    refused = run_with_producer(small, body)
    assert [error.field for error in refused] == ["task", "payload", "payload"]
    assert isinstance(refused[1], TooLarge)
    assert _count(db, schema) == 0


def test_concurrent_enqueues_each_add_one_job(
    queue: Queue, db: psycopg.Connection, schema: str
) -> None:
    async def body(producer: AsyncProducer) -> list[Any]:
        return await asyncio.gather(*(producer.enqueue("t", {"n": n}) for n in range(200)))

    results = run_with_producer(queue, body)
    assert len({result.job.id for result in results}) == 200
    assert sorted(result.job.payload["n"] for result in results) == list(range(200))
    assert _count(db, schema) == 200


def test_an_unreachable_database_is_database_unavailable() -> None:
    # Nothing listens on port 1: the pool cannot connect, and gives up after its timeout.
    with Queue.connect("postgresql://postgres@127.0.0.1:1/none", pool_timeout=1.0) as queue:

        async def body(producer: AsyncProducer) -> None:
            with pytest.raises(DatabaseUnavailable, match="database unavailable"):
                await producer.enqueue("t", {})

        run_with_producer(queue, body)


def test_dependency_mode_goes_through_the_async_producer(queue: Queue) -> None:
    first = queue.enqueue("t", {"n": 1})

    async def body(producer: AsyncProducer) -> Any:
        return await producer.enqueue("t", depends_on=[first.job.id], dependency_mode="finished")

    callback = run_with_producer(queue, body)
    assert queue.dependencies(callback.job.id).dependency_mode == "finished"
    queue.cancel(first.job.id)
    assert queue.get(callback.job.id).state is JobState.QUEUED
