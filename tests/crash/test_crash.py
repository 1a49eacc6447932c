"""Real ``pgqueue worker`` processes SIGKILLed while they work lose no job.

A small run of the crash driver (``pgqueue bench crash``): 150 jobs, five kills of
workers that hold a job. Each killed worker's lease must expire and its job run
again elsewhere; at-least-once allows the duplicate deliveries that follow, never a
job that did not succeed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pgqueue_bench.scenarios.crash import CrashScenario, run_crash

pytestmark = pytest.mark.slow

SCENARIO = CrashScenario(
    jobs=150,
    workers=3,
    concurrency=1,
    lease_seconds=1.0,
    kill_interval=0.3,
    kills=5,
    victims="busy",
    # A little more work per job than the driver's 10-50 ms, so the queue outlasts
    # the five kills even on a fast machine.
    work_ms=(20, 60),
    timeout=120,
)


def test_workers_killed_mid_job_lose_no_job(database_url: str, tmp_path: Path) -> None:
    run = run_crash(database_url, SCENARIO, log_dir=tmp_path)

    assert run["workers_killed"] == SCENARIO.kills
    # The kills hit busy workers: their leases expired and the reaper put the jobs
    # back. Without that, this run would prove nothing about recovery.
    assert run["jobs_with_expired_lease"] >= 1
    assert run["failed_attempts_recorded"] >= 1
    assert not run["timed_out"]
    assert run["jobs_lost"] == 0
    assert run["jobs_succeeded"] == SCENARIO.jobs
    assert run["jobs_never_delivered"] == 0
    assert run["unexpected_worker_exits"] == []


def test_killed_workers_lose_no_job_and_release_no_dependent_early_or_twice(
    database_url: str, tmp_path: Path
) -> None:
    scenario = dataclasses.replace(SCENARIO, dependencies=True)
    run = run_crash(database_url, scenario, log_dir=tmp_path)

    assert run["workers_killed"] == scenario.kills
    assert run["jobs_with_expired_lease"] >= 1
    assert not run["timed_out"]
    assert run["jobs_lost"] == 0
    assert run["jobs_succeeded"] == scenario.jobs
    # 150 jobs in groups of ten: two of each group wait for others.
    assert run["dependent_jobs"] == 30
    assert run["dependents_delivered_early"] == 0
    assert run["dependency_counts_below_zero"] == 0
    assert run["unexpected_worker_exits"] == []
