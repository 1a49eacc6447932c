"""An idempotency key names one job: repeating it with the same task, queue and payload
returns that job, with anything else it is refused (IdempotencyConflict), never answered
with a job that is not the one asked for. Also between concurrent producers."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import IdempotencyConflict, JobSpec, PgQueueError, Queue


def _count(db: psycopg.Connection, schema: str) -> int:
    query = sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(schema))
    return db.execute(query).fetchone()[0]


@pytest.mark.parametrize(
    ("changes", "fields"),
    [
        ({"task": "refund"}, ("task",)),
        ({"queue": "slow"}, ("queue",)),
        ({"payload": {"order": 8}}, ("payload",)),
        ({"task": "refund", "payload": {}}, ("task", "payload")),
    ],
)
def test_a_key_repeated_with_another_task_queue_or_payload_is_refused(
    queue: Queue, db, schema, changes: dict[str, Any], fields: tuple[str, ...]
) -> None:
    first = queue.enqueue("charge", {"order": 7}, idempotency_key="order-7").job
    asked: dict[str, Any] = {"task": "charge", "payload": {"order": 7}, **changes}
    with pytest.raises(IdempotencyConflict) as caught:
        queue.enqueue(asked.pop("task"), asked.pop("payload"), idempotency_key="order-7", **asked)
    conflict = caught.value
    assert isinstance(conflict, PgQueueError)
    assert (conflict.job_id, conflict.key, conflict.fields) == (first.id, "order-7", fields)
    message = str(conflict)
    assert f"job {first.id}" in message and "'order-7'" in message
    assert all(field in message for field in fields)
    assert _count(db, schema) == 1
    assert queue.get(first.id) == first


def test_an_identical_repeat_returns_the_job_also_with_other_options(queue: Queue) -> None:
    first = queue.enqueue("charge", {"a": 1, "b": [1, 2]}, idempotency_key="k").job
    # Key order and the spelling of numbers are not differences: payloads are compared as
    # the JSON values they are; priority, timing and attempts are options, not the job.
    again = queue.enqueue(
        "charge", {"b": [1.0, 2], "a": 1}, idempotency_key="k", priority=5, delay_seconds=60,
        max_attempts=2,
    )  # fmt: skip
    assert not again.created and again.job.id == first.id and again.job.priority == 0


def test_a_batch_with_a_conflicting_item_adds_nothing_and_names_every_conflict(
    queue: Queue, db, schema
) -> None:
    existing = queue.enqueue("charge", {"order": 1}, idempotency_key="one").job
    specs = [
        JobSpec("charge", {"order": 1}, idempotency_key="one"),  # identical: fine
        JobSpec("other"),
        JobSpec("charge", {"order": 2}, idempotency_key="one"),  # payload differs
        JobSpec("mail", {"to": "a"}, idempotency_key="two"),
        JobSpec("mail", {"to": "b"}, idempotency_key="two", queue="q2"),  # differs from item 3
    ]
    with pytest.raises(IdempotencyConflict) as caught:
        queue.enqueue_many(specs)
    conflicts = caught.value.conflicts
    assert [(c.index, c.key, c.fields) for c in conflicts] == [
        (2, "one", ("payload",)),
        (4, "two", ("queue", "payload")),
    ]
    assert conflicts[0].job_id == existing.id
    assert str(caught.value).startswith("item 2: ") and "(and 1 more)" in str(caught.value)
    assert _count(db, schema) == 1  # all or nothing


@pytest.mark.parametrize("autocommit", [False, True])
def test_in_the_callers_transaction_a_refused_batch_leaves_nothing_behind(
    queue: Queue, database_url: str, schema: str, db, autocommit: bool
) -> None:
    queue.enqueue("charge", {"order": 1}, idempotency_key="one")
    with psycopg.connect(database_url, autocommit=autocommit) as conn:
        specs = [JobSpec("fresh"), JobSpec("charge", {"order": 2}, idempotency_key="one")]
        with pytest.raises(IdempotencyConflict):
            queue.enqueue_many(specs, conn=conn)
        # The caller may carry on and commit its other work: the batch is not in it.
        queue.enqueue("after", conn=conn)
        conn.commit()
    tasks = db.execute(
        sql.SQL("SELECT task FROM {}.jobs ORDER BY id").format(sql.Identifier(schema))
    ).fetchall()
    assert [task for (task,) in tasks] == ["charge", "after"]


def _race(queue: Queue, payloads: list[dict[str, Any]]) -> list[Any]:
    """Enqueue one job per payload, all with key 'race', from as many threads at once;
    each thread's outcome or exception, in payload order."""
    barrier = threading.Barrier(len(payloads))
    outcomes: list[Any] = [None] * len(payloads)

    def produce(index: int) -> None:
        barrier.wait()
        try:
            outcomes[index] = queue.enqueue("charge", payloads[index], idempotency_key="race")
        except IdempotencyConflict as exc:
            outcomes[index] = exc

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(len(payloads))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return outcomes


def test_concurrent_identical_repeats_all_get_the_one_job(queue: Queue, db, schema) -> None:
    outcomes = _race(queue, [{"order": 7}] * 8)
    assert sum(outcome.created for outcome in outcomes) == 1
    assert len({outcome.job.id for outcome in outcomes}) == 1
    assert _count(db, schema) == 1


def test_concurrent_differing_repeats_are_refused_except_the_winners(
    queue: Queue, db, schema
) -> None:
    # Two versions of the job race for one key: whichever commits first wins, the
    # producers of the same version get that job, those of the other are refused.
    payloads = [{"version": i % 2} for i in range(8)]
    outcomes = _race(queue, payloads)
    [winner] = [outcome for outcome in outcomes if getattr(outcome, "created", False)]
    for payload, outcome in zip(payloads, outcomes, strict=True):
        if payload == winner.job.payload:
            assert outcome.job.id == winner.job.id
        else:
            assert isinstance(outcome, IdempotencyConflict), outcome
            assert (outcome.job_id, outcome.fields) == (winner.job.id, ("payload",))
    assert sum(isinstance(outcome, IdempotencyConflict) for outcome in outcomes) == 4
    assert _count(db, schema) == 1
