"""Listing, stats and pruning."""

import pytest

from pgqueue import JobSpec, JobState, ValidationError, WorkerProtocol


def test_list_pages_newest_first_with_filters(queue):
    results = queue.enqueue_many(JobSpec("t", queue="a" if i % 2 else "b") for i in range(7))
    ids_a = sorted((r.job.id for r in results if r.job.queue == "a"), reverse=True)
    first = queue.list(queue="a", limit=2)
    second = queue.list(queue="a", limit=2, after=first.next_after)
    assert [j.id for j in first.jobs + second.jobs] == ids_a[:4]
    assert second.next_after is None
    assert queue.list(state="running").jobs == []
    with pytest.raises(ValidationError, match="state"):
        queue.list(state="exploded")


def test_stats_count_each_state_per_queue(queue):
    protocol = WorkerProtocol(queue)
    queue.enqueue_many([JobSpec("t"), JobSpec("t"), JobSpec("t", queue="other")])
    (job,) = protocol.claim(["default"], ["t"], limit=1)
    protocol.ack(job)
    stats = {s.queue: s for s in queue.stats()}
    assert stats["default"].counts == {
        "waiting": 0,
        "queued": 1,
        "running": 0,
        "succeeded": 1,
        "dead": 0,
        "cancelled": 0,
    }
    assert stats["other"].counts["queued"] == 1
    assert stats["default"].oldest_runnable_age_seconds >= 0


def test_prune_deletes_only_old_finished_jobs_in_the_chosen_states(queue):
    protocol = WorkerProtocol(queue)
    queue.enqueue_many(JobSpec("t") for _ in range(5))
    done = protocol.claim(["default"], ["t"], limit=3)
    for job in done[:2]:
        protocol.ack(job)
    queue.cancel(done[2].id)
    assert queue.prune(3600) == 0
    assert queue.prune(0, states=[JobState.SUCCEEDED], batch_size=1) == 2
    remaining = {j.state for j in queue.list().jobs}
    assert remaining == {JobState.QUEUED, JobState.CANCELLED}
    with pytest.raises(ValidationError, match="states"):
        queue.prune(0, states=["queued"])
