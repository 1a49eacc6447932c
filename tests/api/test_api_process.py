"""The real ``pgqueue-api`` and ``pgqueue api`` processes: serving, and refusing to start
with one clear line when something is wrong."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from api_support import TOKEN, free_port, wait_until_healthy
from processes import stop
from psycopg import sql

from pgqueue.gc_tuning import GC_YOUNG_THRESHOLD

BIN = Path(sys.executable).parent
PGQUEUE_API = str(BIN / "pgqueue-api")
PGQUEUE = str(BIN / "pgqueue")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_API_")}
    env.pop("DATABASE_URL", None)
    return {**env, **extra}


@contextmanager
def running(command: list[str], port: int, env: dict[str, str]) -> Iterator[subprocess.Popen]:
    """Start an API process and wait until it answers /healthz; stop it afterwards."""
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_until_healthy(process, f"http://127.0.0.1:{port}", lambda: process.communicate()[1])
        yield process
    finally:
        stop([process], timeout=30)


def test_pgqueue_api_with_two_workers_migrates_and_enqueues_over_http(database_url, db):
    schema = f"p_{uuid.uuid4().hex[:12]}"  # not migrated yet: --migrate does it
    port = free_port()
    command = [PGQUEUE_API, "--port", str(port), "--workers", "2", "--migrate", "--no-access-log"]
    command += ["--database-url", database_url, "--schema", schema]
    try:
        with running(command, port, _env()) as process:
            base = f"http://127.0.0.1:{port}"
            created = httpx.post(f"{base}/jobs", json={"task": "echo", "payload": {"n": 1}})
            assert created.status_code == 201
            job_id = created.json()["id"]
            assert httpx.get(f"{base}/jobs/{job_id}").json()["payload"] == {"n": 1}
            batch = httpx.post(f"{base}/jobs/batch", json={"jobs": [{"task": "echo"}] * 3})
            assert [item["created"] for item in batch.json()["items"]] == [True] * 3
        _, stderr = process.communicate()
        assert "no API tokens are configured" in stderr
        assert "Traceback" not in stderr
    finally:
        db.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def test_pgqueue_api_subcommand_requires_the_tokens_from_env_and_file(
    database_url, schema, tmp_path
):
    token_file = tmp_path / "tokens"
    token_file.write_text("# one per line\nfrom-file\n")
    port = free_port()
    command = [PGQUEUE, "api", "--port", str(port), "--token-file", str(token_file)]
    env = _env(DATABASE_URL=database_url, PGQUEUE_SCHEMA=schema, PGQUEUE_API_TOKENS=TOKEN)
    with running(command, port, env) as process:
        jobs = f"http://127.0.0.1:{port}/jobs"
        assert httpx.get(jobs).status_code == 401
        for token in (TOKEN, "from-file"):
            answer = httpx.get(jobs, headers={"Authorization": f"Bearer {token}"})
            assert answer.status_code == 200
    _, stderr = process.communicate()
    assert "no API tokens are configured" not in stderr


def _refused(*args: str, env: dict[str, str] | None = None) -> str:
    """Run pgqueue-api expecting it to refuse to start; return its one error line (click
    precedes usage mistakes with a usage hint, but never a traceback)."""
    result = subprocess.run(
        [PGQUEUE_API, *args], env=env or _env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def test_unreachable_database_is_one_clear_line():
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    line = _refused("--database-url", url, "--port", str(free_port()))
    assert line.startswith("Error: cannot connect to the database")


def test_taken_port_is_one_clear_line(database_url, schema):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        line = _refused("--database-url", database_url, "--schema", schema, "--port", str(port))
    assert line.startswith(f"Error: cannot listen on 127.0.0.1:{port}")


def test_unmigrated_schema_is_one_clear_line_pointing_at_migrate(database_url):
    line = _refused("--database-url", database_url, "--schema", "never_migrated")
    assert "run `pgqueue migrate --schema never_migrated` or pass --migrate" in line


@pytest.mark.parametrize(
    "args",
    [["--token-file", "/nonexistent/tokens"], ["--max-body-bytes", "0"], ["--workers", "0"]],
)
def test_bad_options_are_one_clear_line(database_url, schema, args):
    line = _refused("--database-url", database_url, "--schema", schema, *args)
    assert line.startswith("Error:")


GC_PROBE = """
import gc
default = gc.get_threshold()[0]
from pgqueue_api import create_app, create_app_from_env
from pgqueue_api.settings import ApiSettings

before = (gc.get_threshold()[0], gc.get_freeze_count())
create_app(ApiSettings(database_url="postgresql://nowhere/x"))
embedded = (gc.get_threshold()[0], gc.get_freeze_count())
create_app_from_env()
print(default, before[0], embedded[0], embedded[1] == before[1], gc.get_threshold()[0], gc.get_freeze_count() > 0)
"""


def test_the_servers_app_factory_tunes_the_garbage_collector_and_create_app_does_not():
    # Neither connects: the pools open when the app starts serving.
    done = subprocess.run(
        [sys.executable, "-c", GC_PROBE],
        env=_env(DATABASE_URL="postgresql://nowhere/x"),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    # The interpreter's own threshold (700 up to Python 3.12, 2,000 from 3.13) until the
    # server's factory runs: importing and create_app leave it alone.
    default, *after = done.stdout.split()
    assert default != str(GC_YOUNG_THRESHOLD)
    assert after == [default, default, "True", str(GC_YOUNG_THRESHOLD), "True"]
