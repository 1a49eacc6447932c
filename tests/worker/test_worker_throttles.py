"""Throttles raised by handlers in real worker processes (``raise pgqueue.Throttle``):
scope "partition" stops every worker starting that key's jobs until it ends while other
keys keep running; scope "queue" stops the whole queue while other queues keep running;
scope "job" delays that job alone and never uses up its attempts; a coroutine handler
throttles the same way.

A throttle ends at ``throttled_until`` = the throttling transaction's now() + seconds,
so it began at ``throttled_until - seconds``. Jobs claimed just before it began may
still start a moment later (a worker claims a little ahead of its free slots): the
windows checked below begin a second after it, and end when it does."""

from __future__ import annotations

from datetime import datetime, timedelta
from itertools import pairwise

from flow_support import Run, read_runs, start_flow_workers
from polling import wait_for

from pgqueue import JobSpec, JobState, Queue

# Jobs claimed before a throttle began may start this long after it.
CLAIMED_AHEAD = timedelta(seconds=1)


def _succeeded(queue: Queue, name: str) -> int:
    counts = {s.queue: s.counts for s in queue.stats()}.get(name, {})
    return counts.get("succeeded", 0)


def _wait_succeeded(queue: Queue, name: str, count: int, timeout: float = 120) -> None:
    wait_for(lambda: _succeeded(queue, name) == count, timeout, what=f"{count} jobs of {name}")


def _throttled_run(db, schema: str) -> Run:
    def found() -> Run | None:
        return next((r for r in read_runs(db, schema) if r.outcome == "throttled"), None)

    return wait_for(found, 60, what="a handler to throttle")


def _partition_throttle(queue: Queue, name: str, key: str) -> datetime | None:
    page = queue.partitions(name, limit=1000)
    return next(
        (p.throttled_until for p in page.partitions if p.partition_key == key),
        None,
    )


def _started_within(runs: list[Run], begin: datetime, end: datetime) -> list[Run]:
    return [r for r in runs if begin <= r.started_at < end]


def test_a_partition_throttle_stops_that_key_on_every_worker_while_others_run(
    queue: Queue, db, schema: str, flow_runs: dict[str, str], start_worker
) -> None:
    seconds = 3.0
    # Claimed first (its priority), while many jobs of both keys wait.
    throttler = queue.enqueue(
        "record",
        {"throttle": {"seconds": seconds, "scope": "partition"}},
        queue="flow",
        priority=1,
        partition_key="hot",
    ).job
    queue.enqueue_many(
        JobSpec("record", {"sleep": 0.2}, queue="flow", partition_key=key)
        for key, count in (("hot", 20), ("cold", 120))
        for _ in range(count)
    )
    start_flow_workers(start_worker, 3, flow_runs, "--queue", "flow", "--concurrency", "2")
    _throttled_run(db, schema)
    until = wait_for(
        lambda: _partition_throttle(queue, "flow", "hot"), 10, what="the key to show throttled"
    )
    began = until - timedelta(seconds=seconds)
    _wait_succeeded(queue, "flow", 141)

    runs = read_runs(db, schema)
    hot = [r for r in runs if r.partition_key == "hot"]
    cold = [r for r in runs if r.partition_key == "cold"]
    during = (began + CLAIMED_AHEAD, until)
    assert _started_within(hot, *during) == [], "a throttled key's job started"
    # The other key kept every worker busy meanwhile...
    cold_during = _started_within(cold, *during)
    assert len(cold_during) >= 5, len(cold_during)
    assert len({r.pid for r in cold_during}) == 3
    # ...and the throttled key ran again once the throttle ended: the throttling job
    # itself too, not before.
    assert [r for r in hot if r.started_at >= until]
    reruns = [r for r in runs if r.job_id == throttler.id]
    assert [r.outcome for r in reruns] == ["throttled", "ok"]
    assert reruns[1].started_at >= until
    assert queue.get(throttler.id).state is JobState.SUCCEEDED


def test_a_queue_throttle_stops_the_queue_while_other_queues_run(
    queue: Queue, db, schema: str, flow_runs: dict[str, str], start_worker
) -> None:
    seconds = 3.0
    throttler = queue.enqueue(
        "record",
        {"throttle": {"seconds": seconds, "scope": "queue"}},
        queue="flow",
        priority=1,
        partition_key="x",
    ).job
    queue.enqueue_many(
        JobSpec("record", {"sleep": 0.2}, queue="flow", partition_key=key)
        for key in ("x", "y")
        for _ in range(10)
    )
    queue.enqueue_many(JobSpec("record", {"sleep": 0.2}, queue="other") for _ in range(80))
    start_flow_workers(
        start_worker, 2, flow_runs, "--queue", "flow", "--queue", "other", "--concurrency", "2"
    )
    _throttled_run(db, schema)

    def queue_throttle() -> datetime | None:
        return {s.queue: s.throttled_until for s in queue.stats()}.get("flow")

    until = wait_for(queue_throttle, 10, what="the queue to show throttled")
    began = until - timedelta(seconds=seconds)
    _wait_succeeded(queue, "flow", 21)
    _wait_succeeded(queue, "other", 80)

    runs = read_runs(db, schema)
    flow_ids = {throttler.id} | {
        job.id for key in ("x", "y") for job in queue.list(queue="flow", partition_key=key).jobs
    }
    assert len(flow_ids) == 21
    flow = [r for r in runs if r.job_id in flow_ids]
    other = [r for r in runs if r.job_id not in flow_ids]
    during = (began + CLAIMED_AHEAD, until)
    assert _started_within(flow, *during) == [], "a throttled queue's job started"
    assert len(_started_within(other, *during)) >= 5
    # Both keys of the queue ran again afterwards.
    assert {r.partition_key for r in flow if r.started_at >= until} == {"x", "y"}


def test_a_job_throttled_three_times_with_one_attempt_still_runs_a_fourth_time(
    queue: Queue, db, schema: str, flow_runs: dict[str, str], start_worker
) -> None:
    seconds = 0.5
    throttled = queue.enqueue(
        "record",
        {"throttle": {"seconds": seconds, "scope": "job", "times": 3}},
        queue="flow",
        partition_key="k",
        max_attempts=1,
    ).job
    # The same key's other jobs are not held back by a throttle of one job.
    others = queue.enqueue_many(
        JobSpec("record", {"sleep": 0.05}, queue="flow", partition_key="k") for _ in range(5)
    )
    # Nothing claimed ahead: a job of the key started after the throttle was claimed after.
    start_flow_workers(
        start_worker, 1, flow_runs, "--queue", "flow", "--concurrency", "2", "--prefetch", "0"
    )
    _wait_succeeded(queue, "flow", 6)

    runs = read_runs(db, schema)
    mine = [r for r in runs if r.job_id == throttled.id]
    assert [r.outcome for r in mine] == ["throttled"] * 3 + ["ok"]
    # Every invocation saw attempt 1: a throttle gives its attempt back.
    assert [r.attempt for r in mine] == [1, 1, 1, 1]
    job = queue.get(throttled.id)
    assert (job.state, job.attempts) == (JobState.SUCCEEDED, 1)
    # Each run waited the throttle out (measured from the handler's end, which precedes
    # the throttle's start).
    for before, after in pairwise(mine):
        assert before.ended_at is not None
        assert after.started_at - before.ended_at >= timedelta(seconds=seconds)
    # While it waited, the key's other jobs started (more than the one that may have been
    # claimed beside it): a job's throttle holds that job alone.
    other_ids = {result.job.id for result in others}
    assert mine[0].ended_at is not None
    meanwhile = _started_within(
        [r for r in runs if r.job_id in other_ids], mine[0].ended_at, mine[1].started_at
    )
    assert len(meanwhile) >= 2, meanwhile


def test_a_coroutine_handler_throttles_its_partition(
    queue: Queue, db, schema: str, flow_runs: dict[str, str], start_worker
) -> None:
    seconds = 2.0
    throttler = queue.enqueue(
        "record_async",
        {"throttle": {"seconds": seconds, "scope": "partition"}},
        queue="flow",
        priority=1,
        partition_key="slow",
    ).job
    queue.enqueue_many(
        JobSpec("record_async", {"sleep": 0.2}, queue="flow", partition_key=key)
        for key, count in (("slow", 10), ("fast", 60))
        for _ in range(count)
    )
    start_flow_workers(start_worker, 1, flow_runs, "--queue", "flow", "--async-concurrency", "4")
    _throttled_run(db, schema)
    until = wait_for(
        lambda: _partition_throttle(queue, "flow", "slow"), 10, what="the key to show throttled"
    )
    began = until - timedelta(seconds=seconds)
    _wait_succeeded(queue, "flow", 71)

    runs = read_runs(db, schema)
    during = (began + CLAIMED_AHEAD, until)
    assert _started_within([r for r in runs if r.partition_key == "slow"], *during) == []
    assert len(_started_within([r for r in runs if r.partition_key == "fast"], *during)) >= 3
    reruns = [r for r in runs if r.job_id == throttler.id]
    assert [r.outcome for r in reruns] == ["throttled", "ok"]
    assert reruns[1].started_at >= until
    assert queue.get(throttler.id).attempts == 1


def test_a_job_without_a_key_throttled_by_partition_waits_alone(
    queue: Queue, db, schema: str, flow_runs: dict[str, str], start_worker
) -> None:
    seconds = 2.0
    throttler = queue.enqueue(
        "record", {"throttle": {"seconds": seconds, "scope": "partition"}}, queue="flow", priority=1
    ).job
    queue.enqueue_many(JobSpec("record", {"sleep": 0.2}, queue="flow") for _ in range(30))
    start_flow_workers(start_worker, 1, flow_runs, "--queue", "flow", "--concurrency", "2")
    first = _throttled_run(db, schema)
    _wait_succeeded(queue, "flow", 31)

    runs = read_runs(db, schema)
    assert first.ended_at is not None
    window = (first.ended_at + CLAIMED_AHEAD, first.ended_at + timedelta(seconds=seconds))
    # The other keyless jobs kept running meanwhile.
    assert len(_started_within([r for r in runs if r.job_id != throttler.id], *window)) >= 3
    reruns = [r for r in runs if r.job_id == throttler.id]
    assert [r.outcome for r in reruns] == ["throttled", "ok"]
    assert reruns[1].started_at - first.ended_at >= timedelta(seconds=seconds)


def test_an_operators_throttle_of_a_key_holds_like_a_handlers(
    queue: Queue, db, schema: str, flow_runs: dict[str, str], start_worker
) -> None:
    seconds = 2.0
    queue.enqueue_many(
        JobSpec("record", {"sleep": 0.2}, queue="flow", partition_key=key)
        for key, count in (("held", 20), ("free", 60))
        for _ in range(count)
    )
    start_flow_workers(start_worker, 2, flow_runs, "--queue", "flow", "--concurrency", "2")
    wait_for(lambda: len(read_runs(db, schema)) >= 4, 60, what="jobs to start")
    queue.throttle("flow", seconds, partition_key="held")
    until = _partition_throttle(queue, "flow", "held")
    assert until is not None
    began = until - timedelta(seconds=seconds)
    _wait_succeeded(queue, "flow", 80)

    runs = read_runs(db, schema)
    during = (began + CLAIMED_AHEAD, until)
    assert _started_within([r for r in runs if r.partition_key == "held"], *during) == []
    assert len(_started_within([r for r in runs if r.partition_key == "free"], *during)) >= 3
    assert [r for r in runs if r.partition_key == "held" and r.started_at >= until]
