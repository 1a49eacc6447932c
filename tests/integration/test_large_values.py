"""Large payloads and results: each is stored, or refused with its size named, and no
statement of any size leaves a call waiting forever.

The calls run under a per-test timeout: before pgqueue stopped committing with
``conn.commit()`` inside its pipelines, a 2 MB result hung ``Queue.ack`` for good (see
docs/psycopg-pipeline-commit-hang.md)."""

from __future__ import annotations

import pytest

from pgqueue import JobSpec, JobState, Queue, ValidationError, WorkerProtocol, outcomes
from pgqueue.validation import PAYLOAD_MAX_BYTES, RESULT_MAX_BYTES, TooLarge, within_limit

pytestmark = pytest.mark.timeout(60)

MB = 1_000_000


@pytest.fixture
def roomy(queue: Queue) -> Queue:
    """``queue`` with payload and result limits far above the defaults."""
    return Queue(
        queue.pool, schema=queue.schema, max_payload_bytes=64 * MB, max_result_bytes=64 * MB
    )


def claim_one(queue: Queue, task: str = "t") -> object:
    protocol = WorkerProtocol(queue)
    [job] = protocol.claim(["default"], [task])
    return job


@pytest.mark.parametrize("size", [3 * MB, 30 * MB])
def test_ack_of_a_large_result_returns_and_stores_it(roomy: Queue, size: int) -> None:
    roomy_protocol = WorkerProtocol(roomy)
    roomy.enqueue("t")
    job = claim_one(roomy)
    done = roomy_protocol.ack(job, "x" * size)
    assert done.state is JobState.SUCCEEDED
    assert len(roomy.get(job.id).result) == size


def test_ack_many_with_a_large_result_returns_and_the_next_claim_works(roomy: Queue) -> None:
    roomy_protocol = WorkerProtocol(roomy)
    roomy.enqueue("t")
    roomy.enqueue("t")
    job = claim_one(roomy)
    batch = roomy_protocol.ack_many([(job, "y" * (5 * MB))])
    claimed = roomy_protocol.claim(["default"], ["t"], 5)
    assert [j.id for j in batch.succeeded] == [job.id]
    assert len(claimed) == 1


def test_a_result_over_the_limit_is_a_failed_attempt_naming_both_sizes(queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    queue.enqueue("t", max_attempts=2)
    job = claim_one(queue)
    failed = protocol.ack(job, "x" * (3 * MB))
    assert failed.state is JobState.QUEUED
    assert failed.last_error == (
        f"result could not be stored: result is {3 * MB + 2} bytes, "
        f"over the limit of {RESULT_MAX_BYTES}"
    )


def test_the_result_limit_is_the_queues_own(queue: Queue) -> None:
    small = Queue(queue.pool, schema=queue.schema, max_result_bytes=100)
    small_protocol = WorkerProtocol(small)
    small.enqueue("t")
    job = claim_one(small)
    failed = small_protocol.ack(job, {"text": "z" * 100})
    assert "over the limit of 100" in failed.last_error
    small.enqueue("t")
    job = claim_one(small)
    assert small_protocol.ack(job, {"text": "z" * 10}).state is JobState.SUCCEEDED


def test_results_are_measured_as_the_json_text_sent(queue: Queue) -> None:
    small = Queue(queue.pool, schema=queue.schema, max_result_bytes=100)
    small_protocol = WorkerProtocol(small)
    small.enqueue("t")
    job = claim_one(small)
    # 40 characters, each sent as a 12-character JSON escape (a surrogate pair).
    failed = small_protocol.ack(job, "\N{GRINNING FACE}" * 40)
    assert "result is 482 bytes, over the limit of 100" in failed.last_error


def test_within_limit_counts_utf8_bytes() -> None:
    assert within_limit("payload", "\N{GRINNING FACE}" * 25, 100)
    with pytest.raises(TooLarge, match="payload is 104 bytes, over the limit of 100"):
        within_limit("payload", "\N{GRINNING FACE}" * 26, 100)
    with pytest.raises(TooLarge, match="payload is 101 bytes"):
        within_limit("payload", "a" * 101, 100)


def test_a_batch_of_results_beyond_one_statements_bound_is_acked_whole(
    roomy: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A bound of 1 kB splits ten 600-byte results into ten statements in one transaction.
    roomy_protocol = WorkerProtocol(roomy)
    monkeypatch.setattr(outcomes, "OUTCOME_STATEMENT_MAX_BYTES", 1000)
    for _ in range(10):
        roomy.enqueue("t")
    jobs = roomy_protocol.claim(["default"], ["t"], 10)
    # A lost lease in a later statement must be reported as that job's, not another's.
    stolen = jobs[7]
    roomy.cancel(stolen.id)
    batch = roomy_protocol.ack_many([(job, "r" * 600) for job in jobs])
    assert batch.lost == [stolen.id]
    assert sorted(j.id for j in batch.succeeded) == sorted(j.id for j in jobs if j is not stolen)
    assert {roomy.get(j.id).state for j in jobs if j is not stolen} == {JobState.SUCCEEDED}


def test_outcome_chunks_keep_order_and_bound_each_statement() -> None:
    storable = [
        outcomes._OutcomeRow(job=None, result=None, text="x" * size, error=None)  # type: ignore[arg-type]
        for size in (5, 5, 5, 20, 1, 1)
    ]
    bound = outcomes.OUTCOME_STATEMENT_MAX_BYTES
    try:
        outcomes.OUTCOME_STATEMENT_MAX_BYTES = 10
        chunks = list(outcomes._chunks(storable))
    finally:
        outcomes.OUTCOME_STATEMENT_MAX_BYTES = bound
    assert [(offset, [len(s.text) for s in chunk]) for offset, chunk in chunks] == [
        (0, [5, 5]),
        (2, [5]),
        (3, [20]),  # larger than the bound: goes alone
        (4, [1, 1]),
    ]


def test_a_payload_over_the_limit_is_refused_with_its_size(queue: Queue) -> None:
    with pytest.raises(TooLarge) as raised:
        queue.enqueue("t", {"data": "p" * PAYLOAD_MAX_BYTES})
    assert str(raised.value) == (
        f"payload is {PAYLOAD_MAX_BYTES + 11} bytes, over the limit of {PAYLOAD_MAX_BYTES}"
    )
    assert queue.list().jobs == []


def test_a_batch_with_one_payload_over_the_limit_adds_nothing_and_names_it(queue: Queue) -> None:
    small = Queue(queue.pool, schema=queue.schema, max_payload_bytes=50)
    specs = [JobSpec("t", {"n": 1}), JobSpec("t", {"big": "b" * 60}), JobSpec("t")]
    with pytest.raises(TooLarge) as raised:
        small.enqueue_many(specs)
    assert raised.value.index == 1
    assert small.list().jobs == []


def test_large_payloads_under_a_raised_limit_are_stored(roomy: Queue) -> None:
    job = roomy.enqueue("t", {"data": "p" * (8 * MB)}).job
    assert len(roomy.get(job.id).payload["data"]) == 8 * MB


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, 2**40])
def test_limits_must_be_sensible(queue: Queue, limit: object) -> None:
    with pytest.raises(ValidationError):
        Queue(queue.pool, schema=queue.schema, max_result_bytes=limit)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        Queue(queue.pool, schema=queue.schema, max_payload_bytes=limit)  # type: ignore[arg-type]
