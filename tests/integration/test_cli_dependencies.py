"""Jobs that wait for other jobs on the command line: ``pgqueue enqueue --depends-on``,
both directions in ``pgqueue job``, and the waiting column of ``pgqueue status``. Real
``pgqueue`` processes on real PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from pgqueue import Queue, WorkerProtocol

PGQUEUE = [str(Path(sys.executable).parent / "pgqueue")]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PGQUEUE, *args], capture_output=True, text=True, env=dict(os.environ), timeout=60
    )


def _json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_enqueue_depends_on_job_shows_both_directions_and_status_counts_waiting(
    database_url: str, schema: str, queue: Queue
) -> None:
    db = ["--database-url", database_url, "--schema", schema]
    first = _json(_run("enqueue", "build", "--queue", "cli", *db))["job"]
    second = _json(_run("enqueue", "build", "--queue", "cli", *db))["job"]
    out = _run(
        "enqueue", "deploy", "--queue", "cli",
        "--depends-on", str(second["id"]), "--depends-on", str(first["id"]),
        *db,
    )  # fmt: skip
    waiting = _json(out)["job"]
    assert waiting["state"] == "waiting"

    shown = _json(_run("job", str(waiting["id"]), *db))
    assert shown["state"] == "waiting"
    assert (shown["depends_on"], shown["dependents"]) == ([first["id"], second["id"]], [])
    shown = _json(_run("job", str(first["id"]), *db))
    assert (shown["depends_on"], shown["dependents"]) == ([], [waiting["id"]])

    status = _run("status", *db)
    assert status.returncode == 0, status.stderr
    header, row = status.stdout.splitlines()[:2]
    assert header.split()[:7] == [
        "queue", "waiting", "queued", "running", "succeeded", "dead", "cancelled",
    ]  # fmt: skip
    assert row.split()[:7] == ["cli", "1", "2", "0", "0", "0", "0"]
    [counts] = _json(_run("status", "--json", *db))
    assert counts["counts"]["waiting"] == 1

    # Cancelling what it waits for cancels it, and the command says which job it cancelled.
    assert _run("cancel", str(first["id"]), *db).stdout.strip() == f"job {first['id']} cancelled"
    shown = _json(_run("job", str(waiting["id"]), *db))
    assert shown["state"] == "cancelled"
    assert shown["last_error"] == f"dependency {first['id']} ended cancelled"


def test_a_dependency_that_already_succeeded_is_met_at_once(
    database_url: str, schema: str, queue: Queue
) -> None:
    protocol = WorkerProtocol(queue)
    db = ["--database-url", database_url, "--schema", schema]
    done = queue.enqueue("build").job
    [claimed] = protocol.claim(["default"], ["build"])
    protocol.ack(claimed, None)
    job = _json(_run("enqueue", "deploy", "--depends-on", str(done.id), *db))["job"]
    assert job["state"] == "queued"


def test_dependency_mistakes_are_one_line_without_a_traceback(
    database_url: str, schema: str, queue: Queue
) -> None:
    db = ["--database-url", database_url, "--schema", schema]
    known = queue.enqueue("build").job
    cases = [
        (
            ("enqueue", "deploy", "--depends-on", "999999", "--depends-on", str(known.id)),
            "Error: depends_on: no job with id 999999",
            1,
        ),
        (("enqueue", "deploy", "--depends-on", "0"), "--depends-on", 2),
        (("enqueue", "deploy", "--depends-on", "abc"), "'abc' is not a valid integer", 2),
        (
            ("enqueue", "deploy", "--depends-on", str(2**63)),
            f"depends_on: {2**63} is not a job id",
            1,
        ),
    ]
    for args, message, status in cases:
        result = _run(*args, *db)
        assert result.returncode == status, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
        if status == 1:
            assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    # Nothing was enqueued by the refused commands.
    assert [job.id for job in queue.list().jobs] == [known.id]


def test_retry_of_a_dependent_says_it_waits_or_names_what_failed(
    database_url: str, schema: str, queue: Queue
) -> None:
    db = ["--database-url", database_url, "--schema", schema]
    dependency = queue.enqueue("build").job
    dependent = queue.enqueue("deploy", depends_on=[dependency.id]).job
    queue.cancel(dependency.id)  # which cancels its dependent too

    refused = _run("retry", str(dependent.id), *db)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"Error: cannot retry job {dependent.id}: its dependency {dependency.id} "
        "(cancelled) will not succeed; retry it first"
    )
    assert queue.get(dependent.id).state.value == "cancelled"

    assert _run("retry", str(dependency.id), *db).stdout.strip() == (
        f"job {dependency.id} queued again"
    )
    retried = _run("retry", str(dependent.id), *db)
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.strip() == f"job {dependent.id} waiting again for its dependencies"
    assert queue.get(dependent.id).state.value == "waiting"


def test_dependency_mode_finished_on_the_command_line(
    database_url: str, schema: str, queue: Queue
) -> None:
    db = ["--database-url", database_url, "--schema", schema]
    doomed = queue.enqueue("build").job
    out = _run(
        "enqueue", "report", "--depends-on", str(doomed.id), "--dependency-mode", "finished", *db
    )
    callback = _json(out)["job"]
    assert callback["state"] == "waiting"
    assert _json(_run("job", str(callback["id"]), *db))["dependency_mode"] == "finished"
    queue.cancel(doomed.id)
    assert _json(_run("job", str(callback["id"]), *db))["state"] == "queued"

    wrong = _run("enqueue", "report", "--dependency-mode", "any", *db)
    assert wrong.returncode == 2
    assert "--dependency-mode" in wrong.stderr and "Traceback" not in wrong.stderr
