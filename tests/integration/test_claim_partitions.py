"""Claim order with partition keys, one claim at a time through WorkerProtocol: the
order docs/operating-queues.md promises (priority first; within a priority, one job per
key per round, keys in turn after the last one served; the jobs without a key first in
each round), and keys with nothing runnable now passed over like throttled ones."""

from __future__ import annotations

from pgqueue import Queue, WorkerProtocol


def _claim(queue: Queue, limit: int) -> set[int]:
    """The ids one claim of up to ``limit`` jobs takes (a claim returns its jobs sorted
    by priority, run_at and id: which jobs it took is what the order decides)."""
    return {job.id for job in WorkerProtocol(queue).claim(["q"], ["t"], limit, worker_id="w")}


def test_jobs_are_taken_one_per_key_per_round_the_keyless_lane_first(queue: Queue) -> None:
    a = [queue.enqueue("t", queue="q", partition_key="a").job.id for _ in range(3)]
    b = [queue.enqueue("t", queue="q", partition_key="b").job.id for _ in range(2)]
    none = [queue.enqueue("t", queue="q").job.id for _ in range(3)]
    assert _claim(queue, 2) == {none[0], a[0]}
    # Round one: the keyless lane, then the keys after "a" (served last), wrapping;
    # round two starts with the keyless lane again.
    assert _claim(queue, 4) == {none[1], b[0], a[1], none[2]}
    assert _claim(queue, 2) == {b[1], a[2]}


def test_the_next_claim_starts_after_the_key_served_last(queue: Queue) -> None:
    jobs = {
        key: [queue.enqueue("t", queue="q", partition_key=key).job.id for _ in range(3)]
        for key in ("a", "b", "c")
    }
    assert _claim(queue, 2) == {jobs["a"][0], jobs["b"][0]}
    assert _claim(queue, 2) == {jobs["c"][0], jobs["a"][1]}
    assert _claim(queue, 1) == {jobs["b"][1]}


def test_a_key_whose_jobs_are_all_delayed_does_not_hold_back_the_others(
    queue: Queue,
) -> None:
    # Key "a" has only a job scheduled an hour ahead (or snoozed by a job throttle):
    # nothing of it is runnable, so the claim must take key "b"'s job.
    queue.enqueue("t", queue="q", partition_key="a", delay_seconds=3600)
    b = queue.enqueue("t", queue="q", partition_key="b").job.id
    assert _claim(queue, 1) == {b}


def test_keys_with_delayed_jobs_do_not_hold_back_a_wider_claim(queue: Queue) -> None:
    for key in ("a", "b", "c"):
        queue.enqueue("t", queue="q", partition_key=key, delay_seconds=3600)
    d = queue.enqueue("t", queue="q", partition_key="d").job.id
    assert _claim(queue, 3) == {d}


def test_priority_comes_before_the_keys_turn(queue: Queue) -> None:
    for key in ("a", "b", "c"):
        queue.enqueue("t", queue="q", partition_key=key, priority=0)
    urgent = queue.enqueue("t", queue="q", partition_key="z", priority=5).job.id
    assert _claim(queue, 1) == {urgent}


def test_priority_comes_before_the_lanes_shares(queue: Queue) -> None:
    urgent = [queue.enqueue("t", queue="q", priority=5).job.id for _ in range(2)]
    queue.enqueue("t", queue="q", partition_key="a", priority=0)
    assert _claim(queue, 2) == set(urgent)


def test_a_claim_of_several_queues_takes_priority_run_at_id_across_them(queue: Queue) -> None:
    # No settings, no keys: a claim of queues a and b takes the three oldest jobs,
    # all of a (claim()'s docstring; so it did before partition keys). A WorkerProtocol's
    # first claim of a list of queues is sent with job_claim_limited, as is every claim
    # once one of the queues has settings or queued jobs with a key.
    a = [queue.enqueue("t", queue="a").job.id for _ in range(3)]
    queue.enqueue("t", queue="b")
    claimed = WorkerProtocol(queue).claim(["a", "b"], ["t"], 3, worker_id="w")
    assert {job.id for job in claimed} == set(a)


def test_a_queue_with_settings_keeps_the_claim_order_across_queues(queue: Queue) -> None:
    queue.update_queue("a", concurrency_limit=10, create=True)
    a1 = queue.enqueue("t", queue="a").job.id
    a2 = queue.enqueue("t", queue="a").job.id
    queue.enqueue("t", queue="b")
    claimed = WorkerProtocol(queue).claim(["a", "b"], ["t"], 2, worker_id="w")
    assert {job.id for job in claimed} == {a1, a2}
