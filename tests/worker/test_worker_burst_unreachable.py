"""A ``--burst`` worker whose database stays unreachable gives up after a bounded wait,
with one line and exit status 4; a long-running worker waits for the database however
long it takes. Real worker processes against a port nothing listens on."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

import pytest
from polling import wait_for
from processes import pgqueue_command
from worker_support import WorkerProcess, worker_environment

# As `pgqueue worker --help` documents.
DATABASE_GAVE_UP_EXIT_CODE = 4

pytestmark = [pytest.mark.slow, pytest.mark.long]


def unreachable_url() -> tuple[str, int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens on it
    return f"postgresql://postgres@127.0.0.1:{port}/postgres", port


def test_a_burst_worker_gives_up_on_an_unreachable_database_with_one_line(tmp_path: Path) -> None:
    url, port = unreachable_url()
    env = worker_environment(tmp_path, PGQUEUE_GIVE_UP_AFTER="1s")
    env.pop("DATABASE_URL", None)

    # Bounded: the give-up time, the pool's 5 s wait for a connection, and stopping.
    finished = subprocess.run(
        [*pgqueue_command(), "worker", "--burst", "--database-url", url],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert finished.returncode == DATABASE_GAVE_UP_EXIT_CODE, finished.stderr
    assert "Traceback" not in finished.stderr
    errors = [line for line in finished.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, finished.stderr
    assert errors[0].startswith("Error: database unavailable for ")
    assert ", giving up: " in errors[0]
    # Which server, and why: not just libpq's last line.
    assert f'"127.0.0.1", port {port} failed: Connection refused' in errors[0]


def test_a_long_running_worker_keeps_waiting_for_the_database(tmp_path: Path) -> None:
    url, _ = unreachable_url()
    args = ["--database-url", url, "--log-level", "debug"]
    env = worker_environment(tmp_path)
    env.pop("DATABASE_URL", None)
    burst = WorkerProcess([*args, "--burst", "--give-up-after", "1s"], env, tmp_path / "b.log")
    serving = WorkerProcess(args, env, tmp_path / "s.log")
    try:
        assert burst.wait() == DATABASE_GAVE_UP_EXIT_CODE
        # Long after the burst worker gave up, the other still retries.
        seen = serving.log().count("still retrying")
        wait_for(
            lambda: serving.log().count("still retrying") > seen,
            timeout=60,
            what="another retry",
        )
        assert serving.process.poll() is None
        assert "giving up" not in serving.log()
        serving.signal(signal.SIGTERM)
        assert serving.wait() == 0
    finally:
        burst.ensure_gone()
        serving.ensure_gone()
