"""A worker runs handlers of each supported signature (payload, job, both), and
``pgqueue worker`` refuses to start with a handler it could not call, in one line."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from processes import environment, pgqueue_command
from worker_support import wait_until_state

from pgqueue import Job, JobState, Queue


def run_worker_command(
    tmp_path: Path, database_url: str, schema: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """Run ``pgqueue worker ARGS`` without installed plugins, from ``tmp_path`` (where
    the test wrote its handler module), to completion."""
    return subprocess.run(
        [
            *pgqueue_command(),
            "worker",
            "--database-url",
            database_url,
            "--schema",
            schema,
            "--no-plugin-autoload",
            *args,
        ],
        env=environment(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_each_supported_signature_runs_in_a_worker(run_worker, queue: Queue) -> None:
    def send_email(job: Job) -> dict[str, Any]:  # the seed's style: the job only
        return {"to": job.payload["to"], "attempt": job.attempts}

    def payload_only(payload: dict[str, Any]) -> dict[str, Any]:
        return payload

    def both(payload: dict[str, Any], job: Job) -> dict[str, Any]:
        return {**payload, "id": job.id}

    async def async_job_only(job: Job) -> int:
        return job.id

    jobs = {
        "send_email": queue.enqueue("send_email", {"to": "ada@example.com"}, max_attempts=1).job,
        "payload_only": queue.enqueue("payload_only", {"n": 1}, max_attempts=1).job,
        "both": queue.enqueue("both", {"n": 2}, max_attempts=1).job,
        "async_job_only": queue.enqueue("async_job_only", {}, max_attempts=1).job,
    }
    run_worker(
        {
            "send_email": send_email,
            "payload_only": payload_only,
            "both": both,
            "async_job_only": async_job_only,
        }
    )

    results = {
        task: wait_until_state(queue, job.id, JobState.SUCCEEDED, JobState.DEAD)
        for task, job in jobs.items()
    }
    assert {task: (job.state, job.last_error) for task, job in results.items()} == {
        task: (JobState.SUCCEEDED, None) for task in jobs
    }
    assert results["send_email"].result == {"to": "ada@example.com", "attempt": 1}
    assert results["payload_only"].result == {"n": 1}
    assert results["both"].result == {"n": 2, "id": jobs["both"].id}
    assert results["async_job_only"].result == jobs["async_job_only"].id


def test_pgqueue_worker_refuses_a_handler_it_cannot_call_in_one_line(
    tmp_path, database_url: str, schema: str
) -> None:
    (tmp_path / "bad_handlers.py").write_text(
        "def send_email(payload, user):\n    return None\n\nHANDLERS = {'send_email': send_email}\n"
    )
    finished = run_worker_command(
        tmp_path, database_url, schema, "--handlers", "bad_handlers:HANDLERS"
    )
    assert finished.returncode == 2
    assert "Traceback" not in finished.stderr
    assert finished.stderr.strip().splitlines()[-1] == (
        "Error: Invalid value for --handlers: task 'send_email' of bad_handlers:HANDLERS: "
        "handler send_email(payload, user) has parameters pgqueue cannot supply: 'user'; "
        "a handler is def f(payload), def f(job) or def f(payload, job)"
    ), finished.stderr


def test_pgqueue_worker_refuses_a_plugins_handler_it_cannot_call_in_one_line(
    tmp_path, database_url: str, schema: str
) -> None:
    (tmp_path / "bad_plugin.py").write_text(
        "from pgqueue import hookimpl\n\n"
        "def send_email():\n    return None\n\n"
        "@hookimpl\ndef register_tasks(register):\n    register('send_email', send_email)\n"
    )
    finished = run_worker_command(tmp_path, database_url, schema, "--plugin", "bad_plugin")
    assert finished.returncode == 1
    assert "Traceback" not in finished.stderr
    lines = finished.stderr.strip().splitlines()
    assert lines[-1] == (
        "Error: task 'send_email' of bad_plugin: handler send_email() has no parameter for "
        "the payload or the job; a handler is def f(payload), def f(job) or def f(payload, job)"
    ), finished.stderr
