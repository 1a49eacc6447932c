"""Results along dependencies and callbacks when a group finishes, run by real
``pgqueue worker`` processes: a fan-in sums its parents' results from
``job.dependencies``, and a callback in ``dependency_mode="finished"`` runs once, after
every job of its group ended, whatever they ended as."""

from __future__ import annotations

import pytest
from worker_support import FAST, TEST_PLUGIN, hook_calls, wait_until_state

from pgqueue import BatchItem, JobSpec, JobState, Queue

pytestmark = pytest.mark.slow

PLUGINS = ("--plugin", TEST_PLUGIN, "--plugin", "workflow_plugin")


def test_a_fan_in_sums_the_results_of_its_ten_parents(start_worker, queue: Queue) -> None:
    # Named in reverse order: job.dependencies follows depends_on, not the ids.
    jobs = queue.enqueue_many(
        [JobSpec("number", {"n": n}) for n in range(1, 11)]
        + [JobSpec("total", depends_on=[BatchItem(i) for i in reversed(range(10))])]
    )
    fan_in = jobs[-1].job
    assert fan_in.state is JobState.WAITING
    for _ in range(2):
        start_worker(*FAST, *PLUGINS, "--concurrency", "4")

    done = wait_until_state(queue, fan_in.id, JobState.SUCCEEDED)
    assert done.result == {"sum": 55, "ids": [r.job.id for r in reversed(jobs[:10])]}


def test_a_finished_mode_callback_runs_once_after_all_three_and_sees_the_dead_one(
    start_worker, queue: Queue, tmp_path
) -> None:
    jobs = queue.enqueue_many(
        [
            JobSpec("number", {"n": 1}),
            JobSpec("number", {"n": 2}),
            JobSpec("always_fails", max_attempts=2),
            JobSpec(
                "report",
                depends_on=[BatchItem(0), BatchItem(1), BatchItem(2)],
                dependency_mode="finished",
            ),
        ]
    )
    group, callback = [r.job for r in jobs[:3]], jobs[3].job
    for _ in range(2):
        start_worker(*FAST, *PLUGINS, "--concurrency", "2")

    done = wait_until_state(queue, callback.id, JobState.SUCCEEDED)
    ended = [queue.get(job.id) for job in group]
    assert [job.state for job in ended] == [JobState.SUCCEEDED] * 2 + [JobState.DEAD]
    assert done.result == {
        "dependencies": [
            {
                "id": group[0].id,
                "task": "number",
                "state": "succeeded",
                "result": 1,
                "pruned": False,
            },
            {
                "id": group[1].id,
                "task": "number",
                "state": "succeeded",
                "result": 2,
                "pruned": False,
            },
            {
                "id": group[2].id,
                "task": "always_fails",
                "state": "dead",
                "result": None,
                "pruned": False,
            },
        ]
    }
    # Once, and after the last of them ended (the dead one failed twice first).
    assert done.attempts == 1
    assert done.started_at >= max(job.finished_at for job in ended if job.finished_at)
    starts = [c for c in hook_calls(tmp_path) if c["hook"] == "on_start"]
    assert [c["job_id"] for c in starts].count(callback.id) == 1
    assert [c["job_id"] for c in starts].count(group[2].id) == 2


def test_a_burst_worker_runs_a_pipeline_and_its_callback_to_the_end(
    start_worker, queue: Queue
) -> None:
    # Each step is released by the write of the one before it, which a burst worker's
    # claim running beside that write does not see: it must look once more before it
    # concludes that nothing is left.
    specs = [JobSpec("number", {"n": 1})]
    specs += [JobSpec("total", depends_on=[BatchItem(i)]) for i in range(5)]
    specs += [JobSpec("always_fails", max_attempts=1)]
    specs += [
        JobSpec("report", depends_on=[BatchItem(5), BatchItem(6)], dependency_mode="finished")
    ]
    jobs = [r.job for r in queue.enqueue_many(specs)]
    worker = start_worker(*PLUGINS, "--burst", "--concurrency", "4")
    assert worker.wait() == 0, worker.log()
    ended = [queue.get(job.id) for job in jobs]
    assert [job.state for job in ended] == [JobState.SUCCEEDED] * 6 + [
        JobState.DEAD,
        JobState.SUCCEEDED,
    ]
    assert ended[5].result == {"sum": 1, "ids": [jobs[4].id]}
    assert [d["state"] for d in ended[7].result["dependencies"]] == ["succeeded", "dead"]
