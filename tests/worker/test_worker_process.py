"""``pgqueue worker`` as users run it: a real process, real plugins, real signals."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest
from processes import pgqueue_command
from worker_support import FAST, TEST_PLUGIN, wait_until_state, worker_environment

from pgqueue import JobState, Queue
from pgqueue.gc_tuning import GC_YOUNG_THRESHOLD
from pgqueue_worker.prepare import SHUTDOWN_TIMED_OUT_EXIT_CODE

pytestmark = pytest.mark.slow


def test_worker_command_runs_the_example_plugin_end_to_end(start_worker, queue: Queue) -> None:
    echo = queue.enqueue("echo", {"hello": "world"}).job
    sleep = queue.enqueue("sleep", {"seconds": 0.1}).job
    flaky = queue.enqueue("flaky", {"fail_times": 1}, max_attempts=3).job
    fail = queue.enqueue("fail", {"message": "no luck"}, max_attempts=2).job

    worker = start_worker(*FAST, "--log-format", "json")
    for job in (echo, sleep, flaky):
        wait_until_state(queue, job.id, JobState.SUCCEEDED)
    wait_until_state(queue, fail.id, JobState.DEAD)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0

    assert queue.get(echo.id).result == {"hello": "world"}
    assert queue.get(sleep.id).result == {"slept": 0.1}
    assert (queue.get(flaky.id).attempts, queue.get(flaky.id).result) == (2, {"attempts": 2})
    dead = queue.get(fail.id)
    assert dead.attempts == 2
    assert "no luck" in dead.last_error

    # One structured line per state change, with the job's fields as keys.
    lines = [json.loads(line) for line in worker.log().splitlines() if line.startswith("{")]
    changes = {(line.get("job_id"), line.get("state")) for line in lines if "job_id" in line}
    assert {(echo.id, "running"), (echo.id, "succeeded"), (fail.id, "dead")} <= changes
    success = next(
        line for line in lines if line.get("job_id") == echo.id and line.get("state") == "succeeded"
    )
    assert success["task"] == "echo"
    assert success["queue"] == "default"
    assert success["attempt"] == 1
    assert success["duration"] is not None


def test_burst_worker_exits_zero_once_nothing_is_runnable(start_worker, queue: Queue) -> None:
    runnable = [queue.enqueue("echo", {"n": n}).job for n in range(5)]
    later = queue.enqueue("echo", {"n": "later"}, delay_seconds=3600).job

    worker = start_worker("--burst")
    assert worker.wait() == 0

    assert all(queue.get(job.id).state is JobState.SUCCEEDED for job in runnable)
    assert queue.get(later.id).state is JobState.QUEUED


def test_sigterm_finishes_the_running_job_claims_nothing_more_and_exits_zero(
    start_worker, queue: Queue
) -> None:
    running = queue.enqueue("sleep", {"seconds": 3}).job
    waiting = queue.enqueue("echo", {}).job  # claimed only after the first, with one slot

    worker = start_worker("--concurrency", "1")
    wait_until_state(queue, running.id, JobState.RUNNING)
    worker.signal(signal.SIGTERM)

    assert worker.wait() == 0
    assert queue.get(running.id).result == {"slept": 3}
    assert queue.get(waiting.id).state is JobState.QUEUED
    assert queue.list(state="running").jobs == []


def test_a_second_signal_exits_at_once_leaving_the_job_to_its_lease(
    start_worker, queue: Queue
) -> None:
    job = queue.enqueue("sleep", {"seconds": 120}).job
    worker = start_worker("--shutdown-timeout", "600")
    wait_until_state(queue, job.id, JobState.RUNNING)

    worker.signal(signal.SIGINT)
    worker.wait_for_log("send it again to exit at once")
    worker.signal(signal.SIGINT)

    assert worker.wait() == 128 + signal.SIGINT
    assert queue.get(job.id).state is JobState.RUNNING


def test_shutdown_timeout_leaves_running_jobs_to_their_leases(start_worker, queue: Queue) -> None:
    job = queue.enqueue("sleep", {"seconds": 120}).job
    worker = start_worker("--shutdown-timeout", "0.5")
    wait_until_state(queue, job.id, JobState.RUNNING)

    worker.signal(signal.SIGTERM)

    assert worker.wait() == SHUTDOWN_TIMED_OUT_EXIT_CODE == 3
    assert "leaving 1 running jobs" in worker.log()
    assert queue.get(job.id).state is JobState.RUNNING


def test_worker_without_any_handler_exits_2_and_says_how_to_add_some(tmp_path) -> None:
    finished = subprocess.run(
        [*pgqueue_command(), "worker", "--no-plugin-autoload"],
        env=worker_environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert finished.returncode == 2
    assert "no task handlers" in finished.stderr
    assert "--handlers module:ATTR" in finished.stderr
    assert "pip install pgqueue-examples" in finished.stderr
    assert "--plugin" in finished.stderr


def test_every_flag_can_come_from_a_pgqueue_environment_variable(
    database_url: str, schema: str, queue: Queue, tmp_path
) -> None:
    alpha = queue.enqueue("echo", {"q": "alpha"}, queue="alpha").job
    beta = queue.enqueue("echo", {"q": "beta"}, queue="beta").job
    gamma = queue.enqueue("echo", {"q": "gamma"}, queue="gamma").job
    env = worker_environment(
        tmp_path,
        PGQUEUE_DATABASE_URL=database_url,
        PGQUEUE_SCHEMA=schema,
        PGQUEUE_QUEUE="alpha,beta",
        PGQUEUE_CONCURRENCY="3",
        PGQUEUE_BURST="1",
        PGQUEUE_NO_LISTEN="1",
        PGQUEUE_LOG_FORMAT="json",
    )
    env.pop("DATABASE_URL", None)

    finished = subprocess.run(
        [*pgqueue_command(), "worker"], env=env, capture_output=True, text=True, timeout=60
    )

    assert finished.returncode == 0, finished.stderr
    assert queue.get(alpha.id).state is JobState.SUCCEEDED
    assert queue.get(beta.id).state is JobState.SUCCEEDED
    assert queue.get(gamma.id).state is JobState.QUEUED
    start = json.loads(finished.stderr.splitlines()[0])
    assert "queues alpha, beta" in start["message"]
    assert "3 slots" in start["message"]
    assert "polling every" in start["message"] and "LISTEN" not in start["message"]


def test_explicit_handlers_add_to_plugins_and_win_a_name_clash(start_worker, queue: Queue) -> None:
    echo = queue.enqueue("echo", {"word": "hi"}).job
    whoami = queue.enqueue("whoami", {}).job

    worker = start_worker(
        "--burst", "--plugin", TEST_PLUGIN, "--handlers", "worker_test_handlers:SHOUTING"
    )

    assert worker.wait() == 0
    assert queue.get(echo.id).result == {"word": "HI"}
    assert queue.get(whoami.id).result["pid"] == worker.pid
    assert "task 'echo' from worker_test_handlers:SHOUTING replaces" in worker.log()


def test_the_worker_process_freezes_its_start_up_and_collects_young_garbage_less_often(
    start_worker, queue: Queue
) -> None:
    job = queue.enqueue("garbage_collector", {}).job

    worker = start_worker("--burst", "--handlers", "worker_test_handlers:INTROSPECTING")

    assert worker.wait() == 0
    result = queue.get(job.id).result
    assert result["young_threshold"] == GC_YOUNG_THRESHOLD
    # Modules, plugins and the pool, at least: thousands of objects.
    assert result["frozen"] > 1000


def test_a_bad_handlers_spec_is_a_usage_error(tmp_path) -> None:
    finished = subprocess.run(
        [*pgqueue_command(), "worker", "--handlers", "worker_test_handlers:MISSING"],
        env=worker_environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert finished.returncode == 2
    assert "has no attribute 'MISSING'" in finished.stderr


def test_worker_on_an_unmigrated_schema_says_how_to_migrate(database_url: str, tmp_path) -> None:
    finished = subprocess.run(
        [*pgqueue_command(), "worker", "--database-url", database_url, "--schema", "nothing_here"],
        env=worker_environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert finished.returncode == 1
    assert "pgqueue migrate --schema nothing_here" in finished.stderr
