"""Flow control in the claim: fair share between partition keys, limits per key,
throttles, and the listing of a queue's keys (statements against real PostgreSQL; the
same behaviours with worker processes are in tests/worker)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

from pgqueue import JobSpec, Queue, Throttle, ValidationError, WorkerProtocol


def keys_of(jobs) -> list[str | None]:
    return [job.partition_key for job in jobs]


def test_a_job_keeps_its_partition_key_from_every_producer_to_history(queue: Queue) -> None:
    single = queue.enqueue("t", partition_key="tenant-1").job
    [batch] = queue.enqueue_many([JobSpec("t", partition_key="tenant-2")])
    keyed = queue.enqueue("t", idempotency_key="k", partition_key="tenant-3").job
    copied = queue.enqueue_many([JobSpec("t", partition_key=f"c{n}") for n in range(600)])
    assert single.partition_key == "tenant-1" and queue.get(single.id).partition_key == "tenant-1"
    assert queue.get(batch.job.id).partition_key == "tenant-2"
    assert queue.get(keyed.id).partition_key == "tenant-3"
    assert queue.get(copied[599].job.id).partition_key == "c599"
    assert queue.get(single.id).to_dict()["partition_key"] == "tenant-1"
    # Claimed, acked and read back from history, it still carries its key.
    protocol = WorkerProtocol(queue)
    jobs = protocol.claim(["default"], ["t"], limit=1000)
    assert {job.id: job.partition_key for job in jobs}[single.id] == "tenant-1"
    protocol.ack_many([(job, None) for job in jobs])
    assert queue.get(single.id).partition_key == "tenant-1"
    page = queue.list(partition_key="tenant-2")
    assert [job.id for job in page.jobs] == [batch.job.id]


@pytest.mark.parametrize("key", ["", "x" * 201, 7, "a\x00b"])
def test_a_bad_partition_key_is_refused_naming_the_field(queue: Queue, key: object) -> None:
    with pytest.raises(ValidationError) as refused:
        queue.enqueue("t", partition_key=key)  # type: ignore[arg-type]
    assert refused.value.field == "partition_key"
    assert queue.list().jobs == []


def test_claims_take_one_job_per_key_per_round_in_turn(queue: Queue) -> None:
    """50 jobs of a big key enqueued before 5 of a small one, and one without a key:
    each claim takes the keys in turn, not the backlog in enqueue order."""
    queue.enqueue_many([JobSpec("t", {"n": n}, partition_key="big") for n in range(50)])
    queue.enqueue_many([JobSpec("t", {"n": n}, partition_key="small") for n in range(5)])
    queue.enqueue("t", {"n": "none"})
    protocol = WorkerProtocol(queue)
    first = protocol.claim(["default"], ["t"], limit=7)
    assert Counter(keys_of(first)) == {"big": 3, "small": 3, None: 1}
    # Within a key, enqueue order.
    assert [job.payload["n"] for job in first if job.partition_key == "big"] == [0, 1, 2]
    second = protocol.claim(["default"], ["t"], limit=4)
    assert Counter(keys_of(second)) == {"big": 2, "small": 2}


def test_the_turn_moves_on_across_claims_so_every_key_is_served(queue: Queue) -> None:
    """Claims of one job at a time serve the keys in turn, wrapping around."""
    for key in ("a", "b", "c"):
        queue.enqueue_many([JobSpec("t", partition_key=key) for _ in range(3)])
    protocol = WorkerProtocol(queue)
    served = [keys_of(protocol.claim(["default"], ["t"], limit=1))[0] for _ in range(7)]
    assert served == ["a", "b", "c", "a", "b", "c", "a"]


def test_priority_wins_over_fair_share(queue: Queue) -> None:
    queue.enqueue_many([JobSpec("t", partition_key="big") for _ in range(20)])
    urgent = queue.enqueue("t", priority=5, partition_key="big").job
    queue.enqueue("t", partition_key="small")
    protocol = WorkerProtocol(queue)
    [first] = protocol.claim(["default"], ["t"], limit=1)
    assert first.id == urgent.id


def test_a_partition_concurrency_limit_counts_each_keys_running_jobs(queue: Queue) -> None:
    queue.enqueue_many([JobSpec("t", partition_key=key) for key in "aaaabbbb"])
    queue.enqueue_many([JobSpec("t") for _ in range(4)])
    queue.update_queue("default", partition_concurrency_limit=2)
    protocol = WorkerProtocol(queue)
    claimed = protocol.claim(["default"], ["t"], limit=100)
    # Two of each key; the jobs without a key are bound by the queue's limits only.
    assert Counter(keys_of(claimed)) == {"a": 2, "b": 2, None: 4}
    assert protocol.claim(["default"], ["t"], limit=100) == []
    protocol.ack(next(job for job in claimed if job.partition_key == "a"), None)
    assert keys_of(protocol.claim(["default"], ["t"], limit=100)) == ["a"]
    queue.update_queue("default", partition_concurrency_limit=None)
    assert Counter(keys_of(protocol.claim(["default"], ["t"], limit=100))) == {"a": 1, "b": 2}


def test_a_partition_rate_limit_is_a_bucket_per_key(queue: Queue, db: psycopg.Connection) -> None:
    queue.enqueue_many([JobSpec("t", partition_key=key) for key in "aaaaabbbbb"])
    # 10 jobs a second per key: a bucket holds one job (a tenth of a second's worth).
    queue.update_queue("default", partition_rate_limit=10.0)
    protocol = WorkerProtocol(queue)
    assert Counter(keys_of(protocol.claim(["default"], ["t"], limit=100))) == {"a": 1, "b": 1}
    assert protocol.claim(["default"], ["t"], limit=100) == []
    # The buckets refill on the database clock: move their last spend back a second.
    db.execute(
        sql.SQL(
            "UPDATE {}.partition_controls SET tokens_at = tokens_at - interval '1 second'"
        ).format(sql.Identifier(queue.schema))
    )
    assert Counter(keys_of(protocol.claim(["default"], ["t"], limit=100))) == {"a": 1, "b": 1}


def test_a_throttle_gives_the_attempt_back_and_holds_back_its_scope(queue: Queue) -> None:
    queue.enqueue_many([JobSpec("t", partition_key="a", max_attempts=1) for _ in range(3)])
    queue.enqueue_many([JobSpec("t", partition_key="b") for _ in range(3)])
    queue.enqueue("u")
    protocol = WorkerProtocol(queue)
    [a1, b1] = protocol.claim(["default"], ["t"], limit=2)
    assert (a1.partition_key, b1.partition_key) == ("a", "b") and a1.attempts == 1
    assert protocol.throttle_many([(a1, Throttle(60, scope="partition"))]) == [a1.id]
    back = queue.get(a1.id)
    assert back.state.value == "queued" and back.attempts == 0 and back.errors == []
    assert back.run_at - back.enqueued_at >= timedelta(seconds=59)
    # Key a waits; key b goes on.
    assert set(keys_of(protocol.claim(["default"], ["t"], limit=10))) == {"b"}
    [listed] = [p for p in queue.partitions("default").partitions if p.partition_key == "a"]
    assert listed.throttled_until is not None and listed.queued == 3
    assert queue.throttled_partitions() == {"default": 1}
    # An operator ends it; a queue throttle then holds back every job of the queue.
    queue.throttle("default", 0, partition_key="a")
    assert queue.throttled_partitions() == {}
    [u] = protocol.claim(["default"], ["u"], limit=1)
    assert protocol.throttle_many([(u, Throttle(60, scope="queue"))]) == [u.id]
    assert protocol.claim(["default"], ["t", "u"], limit=10) == []
    assert queue.stats()[0].throttled_until is not None
    assert queue.throttle("default", 0) is not None
    assert set(keys_of(protocol.claim(["default"], ["t"], limit=10))) == {"a"}


def test_a_throttle_of_a_lost_lease_writes_nothing(queue: Queue) -> None:
    queue.enqueue("t", partition_key="a")
    protocol = WorkerProtocol(queue)
    [job] = protocol.claim(["default"], ["t"], limit=1)
    queue.cancel(job.id)
    assert protocol.throttle_many([(job, Throttle(60, scope="partition"))]) == []
    assert queue.throttled_partitions() == {}


def test_a_job_throttled_again_and_again_never_goes_dead(queue: Queue) -> None:
    queue.enqueue("t", max_attempts=1)
    protocol = WorkerProtocol(queue)
    for _ in range(3):
        [job] = protocol.claim(["default"], ["t"], limit=1)
        protocol.throttle_many([(job, Throttle(0))])
    [job] = protocol.claim(["default"], ["t"], limit=1)
    assert job.attempts == 1
    protocol.ack(job, None)
    assert queue.get(job.id).state.value == "succeeded"


def test_partitions_are_listed_busiest_first_and_paged(queue: Queue) -> None:
    for key, jobs in (("quiet", 1), ("busy", 5), ("mid-a", 3), ("mid-b", 3)):
        queue.enqueue_many([JobSpec("t", partition_key=key) for _ in range(jobs)])
    queue.enqueue("t")  # no key: not listed
    first = queue.partitions("default", limit=2)
    assert [(p.partition_key, p.queued) for p in first.partitions] == [("busy", 5), ("mid-a", 3)]
    assert first.next_after is not None
    rest = queue.partitions("default", limit=2, after=first.next_after)
    assert [p.partition_key for p in rest.partitions] == ["mid-b", "quiet"]
    assert rest.next_after is None
    with pytest.raises(ValidationError) as refused:
        queue.partitions("default", after="not-a-cursor")
    assert refused.value.field == "after"
    with pytest.raises(ValidationError):
        queue.partitions("default", limit=0)


def test_a_worker_role_may_throttle_and_claim_under_partition_limits(
    queue: Queue, database_url: str, schema: str, db: psycopg.Connection
) -> None:
    from pgqueue.roles import grant_roles

    groups = grant_roles(database_url, schema)
    login = f"{groups.worker}_fc"
    db.execute(
        sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
            sql.Identifier(login), sql.Identifier(groups.worker)
        )
    )
    try:
        queue.enqueue_many([JobSpec("t", partition_key=key) for key in "aabb"])
        queue.update_queue("default", partition_rate_limit=10.0, partition_concurrency_limit=5)
        url = psycopg.conninfo.make_conninfo(database_url, user=login)
        with Queue.connect(url, schema=schema) as as_worker:
            protocol = WorkerProtocol(as_worker)
            jobs = protocol.claim(["default"], ["t"], limit=10)
            assert Counter(keys_of(jobs)) == {"a": 1, "b": 1}
            scopes = [
                (jobs[0], Throttle(30, scope="partition")),
                (jobs[1], Throttle(30, scope="queue")),
            ]
            assert sorted(protocol.throttle_many(scopes)) == sorted(job.id for job in jobs)
            assert protocol.reap() == []
    finally:
        db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(login)))
        db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(login)))
    assert queue.stats()[0].throttled_until is not None
