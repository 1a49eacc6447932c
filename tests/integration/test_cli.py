"""The pgqueue command line, run as a real process."""

import json
import os
import subprocess
import sys
from pathlib import Path

PGQUEUE = [str(Path(sys.executable).parent / "pgqueue")]


def run(*args: str, env: dict[str, str] | None = None, cwd: str | None = None):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [*PGQUEUE, *args], capture_output=True, text=True, env=full_env, cwd=cwd, timeout=60
    )


def test_enqueue_status_job_cancel_retry_and_prune(database_url, schema):
    db = ["--database-url", database_url, "--schema", schema]
    out = run("enqueue", "echo", "--payload", '{"x": 1}', "--queue", "cli", *db)
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)["job"]
    assert job["payload"] == {"x": 1} and job["state"] == "queued"

    status = run("status", *db)
    assert status.returncode == 0
    header, row = status.stdout.split("\n")[:2]
    assert header.split()[:3] == ["queue", "waiting", "queued"]
    assert row.split()[:3] == ["cli", "0", "1"]

    shown = json.loads(run("job", str(job["id"]), *db).stdout)
    assert shown["id"] == job["id"]
    assert run("cancel", str(job["id"]), *db).stdout.strip() == f"job {job['id']} cancelled"
    assert run("retry", str(job["id"]), *db).returncode == 0
    assert run("cancel", str(job["id"]), *db).returncode == 0
    assert run("prune", "--older-than", "0s", "--state", "cancelled", *db).stdout.strip() == (
        "pruned 1 jobs"
    )


def test_client_mistakes_get_one_line_errors_without_tracebacks(database_url, schema):
    db = ["--database-url", database_url, "--schema", schema]
    cases = [
        (run("enqueue", "bad name", *db), "task: may contain only"),
        (run("enqueue", "echo", "--payload", "[1]", *db), "payload: must be a JSON object"),
        (run("enqueue", "echo", "--payload", "{", *db), "not valid JSON"),
        (run("job", "999999", *db), "job 999999 not found"),
        (run("prune", "--older-than", "soon", *db), "not a duration"),
        (run("status", "--database-url", "postgresql://postgres@127.0.0.1:1/x"), "cannot connect"),
    ]
    for result, message in cases:
        assert result.returncode != 0
        assert message in result.stderr
        assert "Traceback" not in result.stderr


def test_a_command_without_a_database_says_how_to_get_one(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["PGQUEUE_PGDATA"] = str(tmp_path / "no-server-here")
    result = subprocess.run(
        [*PGQUEUE, "status"], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 2
    for hint in ("--database-url", "DATABASE_URL", "pgqueue db start"):
        assert hint in result.stderr
    assert "Traceback" not in result.stderr


def test_plugins_lists_the_installed_example_plugin():
    result = run("plugins", "--json")
    plugins = {p["name"]: p for p in json.loads(result.stdout)}
    assert plugins["examples"]["tasks"] == ["echo", "fail", "flaky", "sleep"]
    assert plugins["examples"]["version"] == "0.1.0"
    assert "on_dead" in plugins["pgqueue.lifecycle_log"]["hooks"]


def test_migrate_reports_an_up_to_date_schema(database_url, schema):
    result = run("migrate", "--database-url", database_url, "--schema", schema)
    assert result.stdout.strip() == f"schema {schema} is up to date"
