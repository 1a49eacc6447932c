"""``pgqueue enqueue ... --wait S`` and ``pgqueue job ID --wait S``: a shell script runs a
job and checks how it ended by the exit status. Real ``pgqueue`` processes (a worker
running the example tasks, and the commands) on real PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from worker_support import FAST

pytestmark = pytest.mark.slow

PGQUEUE = [str(Path(sys.executable).parent / "pgqueue")]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PGQUEUE, *args], capture_output=True, text=True, env=dict(os.environ), timeout=60
    )


def test_enqueue_and_job_with_wait_print_the_final_job_and_exit_by_its_state(
    start_worker, database_url: str, schema: str
) -> None:
    db = ["--database-url", database_url, "--schema", schema]
    start_worker(*FAST)

    done = run("enqueue", "echo", "--payload", '{"a": 1}', "--wait", "10", *db)
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)["job"]
    assert (job["state"], job["result"]) == ("succeeded", {"a": 1})
    shown = run("job", str(job["id"]), "--wait", "10", *db)
    assert shown.returncode == 0 and json.loads(shown.stdout)["result"] == {"a": 1}

    failed = run(
        "enqueue", "fail", "--payload", '{"message": "no luck"}', "--max-attempts", "1",
        "--wait", "10", *db,
    )  # fmt: skip
    assert failed.returncode == 4, failed.stderr
    dead = json.loads(failed.stdout)["job"]
    assert dead["state"] == "dead"
    assert failed.stderr.strip().splitlines() == [
        f"job {dead['id']} ended dead: ExampleFailure: no luck"
    ]

    # Nobody serves this task: the wait ends with the job still queued.
    waiting = run("enqueue", "nobody-serves-this", "--wait", "0.5", *db)
    assert waiting.returncode == 5, waiting.stderr
    queued = json.loads(waiting.stdout)["job"]
    assert queued["state"] == "queued"
    assert waiting.stderr.strip().splitlines() == [
        f"job {queued['id']} is still queued after waiting 0.5 s"
    ]
    still = run("job", str(queued["id"]), "--wait", "0.2", *db)
    assert still.returncode == 5 and json.loads(still.stdout)["state"] == "queued"


@pytest.mark.parametrize("wait", ["0", "-1", "abc", "nan", "inf"])
def test_a_bad_wait_is_a_usage_error(wait: str, database_url: str, schema: str) -> None:
    db = ["--database-url", database_url, "--schema", schema]
    for command in (["enqueue", "echo"], ["job", "1"]):
        result = run(*command, "--wait", wait, *db)
        assert result.returncode == 2, result
        assert "--wait" in result.stderr and "Traceback" not in result.stderr
