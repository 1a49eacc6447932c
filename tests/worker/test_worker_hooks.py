"""Lifecycle hooks from plugins run after each state change commits: on_fail once per
failed attempt, on_dead exactly once per dead job (from the worker or the reaper), and
a hook that raises changes nothing."""

from __future__ import annotations

import signal
from collections import Counter

import pytest
from polling import wait_for
from worker_support import FAST, RAISING_HOOKS_VARIABLE, TEST_PLUGIN, hook_calls, wait_until_state

from pgqueue import JobState, Queue

pytestmark = pytest.mark.slow


def test_on_fail_fires_once_per_failed_attempt_and_on_dead_once(
    start_worker, queue: Queue, tmp_path
) -> None:
    doomed = queue.enqueue("fail", {"message": "nope"}, max_attempts=3).job
    flaky = queue.enqueue("flaky", {"fail_times": 1}, max_attempts=3).job

    worker = start_worker(*FAST, "--plugin", TEST_PLUGIN)
    wait_until_state(queue, doomed.id, JobState.DEAD)
    wait_until_state(queue, flaky.id, JobState.SUCCEEDED)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0

    calls = hook_calls(tmp_path)
    doomed_fails = [c for c in calls if c["job_id"] == doomed.id and c["hook"] == "on_fail"]
    assert [c["attempt"] for c in doomed_fails] == [1, 2, 3]
    assert all("nope" in c["error"] for c in doomed_fails)
    assert [c["next_run_at"] is None for c in doomed_fails] == [False, False, True]
    deaths = [(c["job_id"], c["attempt"], c["state"]) for c in calls if c["hook"] == "on_dead"]
    assert deaths == [(doomed.id, 3, "dead")]

    flaky_calls = Counter(c["hook"] for c in calls if c["job_id"] == flaky.id)
    assert flaky_calls == {"on_start": 2, "on_fail": 1, "on_success": 1}


def test_the_reaper_dead_letters_an_expired_job_once_and_runs_its_hooks(
    start_worker, queue: Queue, tmp_path
) -> None:
    job = queue.enqueue("stall_first", {}, max_attempts=1).job
    victim = start_worker(*FAST, "--plugin", TEST_PLUGIN)
    wait_until_state(queue, job.id, JobState.RUNNING)
    victim.signal(signal.SIGKILL)
    victim.wait()

    # Two reapers race for every round; the advisory lock lets one at a time reap.
    reapers = [start_worker(*FAST, "--plugin", TEST_PLUGIN) for _ in range(2)]
    dead = wait_until_state(queue, job.id, JobState.DEAD)
    assert dead.last_error.startswith("lease expired")
    wait_for(lambda: any(c["hook"] == "on_dead" for c in hook_calls(tmp_path)))
    for reaper in reapers:
        # One reaper may have done it all before the other finished starting.
        assert reaper.stop() == 0, reaper.log()

    reaped = [c for c in hook_calls(tmp_path) if c["hook"] in ("on_fail", "on_dead")]
    assert [(c["hook"], c["attempt"], c["state"]) for c in reaped] == [
        ("on_fail", 1, "dead"),
        ("on_dead", 1, "dead"),
    ]
    assert reaped[0]["next_run_at"] is None
    assert reaped[0]["error"].startswith("lease expired")
    # Both ran in the reaper that reaped it, one of the two still alive.
    assert reaped[0]["pid"] == reaped[1]["pid"]
    assert reaped[0]["pid"] in {reaper.pid for reaper in reapers}


def test_a_raising_hook_is_logged_and_counted_and_changes_nothing(
    start_worker, queue: Queue, tmp_path
) -> None:
    first = queue.enqueue("echo", {"n": 1}).job
    doomed = queue.enqueue("fail", {}, max_attempts=1).job

    worker = start_worker(*FAST, "--plugin", TEST_PLUGIN, env={RAISING_HOOKS_VARIABLE: "1"})
    wait_until_state(queue, first.id, JobState.SUCCEEDED)
    wait_until_state(queue, doomed.id, JobState.DEAD)
    # Still serving after every hook raised.
    later = queue.enqueue("echo", {"n": 2}).job
    assert wait_until_state(queue, later.id, JobState.SUCCEEDED).result == {"n": 2}
    worker.signal(signal.SIGTERM)

    assert worker.wait() == 0
    log = worker.log()
    assert f"hook on_start of plugin {TEST_PLUGIN} raised; ignored" in log
    assert f"hook on_dead of plugin {TEST_PLUGIN} raised; ignored" in log
    assert (
        "lifecycle hooks raised and were ignored: on_dead 1, on_fail 1, on_start 3, on_success 2"
        in log
    )
    hooks_called = Counter(c["hook"] for c in hook_calls(tmp_path))
    assert hooks_called == {"on_start": 3, "on_success": 2, "on_fail": 1, "on_dead": 1}
