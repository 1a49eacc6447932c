"""PostgreSQL restarted under a working fleet loses no job.

Each test runs the restart driver (``pgqueue bench restart``) against a private
cluster of its own (never the shared servers), of the same major version as the
suite's server, restarted with ``pg_ctl restart -m fast`` (clean shutdown) or
``-m immediate`` (no shutdown checkpoint: crash recovery on start).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pgqueue_bench.scenarios.restart import RestartScenario, run_on_private_server

pytestmark = pytest.mark.slow

SCENARIO = RestartScenario(
    jobs=80,
    workers=2,
    concurrency=2,
    lease_seconds=2.0,
    restart_at=0.3,
    timeout=120,
)


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_server_restart_loses_no_job(mode: str, tmp_path: Path) -> None:
    run, _ = run_on_private_server(SCENARIO, mode, log_dir=tmp_path)

    # The restart hit a fleet with work left to do.
    assert run["jobs_succeeded_before_restart"] < SCENARIO.jobs
    assert not run["timed_out"]
    assert run["jobs_lost"] == 0
    assert run["jobs_succeeded"] == SCENARIO.jobs
    assert run["jobs_never_delivered"] == 0
    assert run["unexpected_worker_exits"] == []
