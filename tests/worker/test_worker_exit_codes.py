"""The exit statuses of ``pgqueue worker`` are the ones its ``--help`` lists: a real
worker process and real signals."""

from __future__ import annotations

import signal
import subprocess

import pytest
from processes import pgqueue_command
from worker_support import wait_until_state

from pgqueue import JobState, Queue

pytestmark = pytest.mark.slow


def test_a_second_sigterm_exits_at_once_with_143_leaving_the_job_to_its_lease(
    start_worker, queue: Queue
) -> None:
    job = queue.enqueue("sleep", {"seconds": 120}).job
    worker = start_worker("--shutdown-timeout", "600")
    wait_until_state(queue, job.id, JobState.RUNNING)

    worker.signal(signal.SIGTERM)
    worker.wait_for_log("send it again to exit at once")
    worker.signal(signal.SIGTERM)

    assert worker.wait() == 128 + signal.SIGTERM == 143
    assert "SIGTERM received again: exiting now" in worker.log()
    assert queue.get(job.id).state is JobState.RUNNING


def test_help_lists_every_exit_status() -> None:
    shown = subprocess.run(
        [*pgqueue_command(), "worker", "--help"], capture_output=True, text=True, check=True
    ).stdout
    statuses = {
        line.split()[0]
        for line in shown.split("Exit status:")[1].splitlines()
        if line.strip() and line.split()[0].isdigit()
    }
    # Clean, error, usage, shutdown timeout, database gone, second SIGINT / SIGTERM.
    assert statuses == {"0", "1", "2", "3", "4", "130"}
    assert "130 a second SIGINT, 143 a second SIGTERM" in " ".join(shown.split())
