"""``pgqueue-api --log-format json``: one JSON object per line from a real API process,
with the request id (the client's X-Request-ID, or a new one, echoed back) and the id
of the job a route handled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_support import free_port, wait_until_healthy
from polling import wait_for
from processes import stop

PGQUEUE_API = str(Path(sys.executable).parent / "pgqueue-api")


@contextmanager
def api_process(args: list[str], env: dict[str, str], log_path: Path) -> Iterator[str]:
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_API_")}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [PGQUEUE_API, "--port", str(port), *args],
            env={**clean, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(process, base, log_path.read_text)
        yield base
    finally:
        stop([process], timeout=30)


def json_lines(log_path: Path) -> list[dict[str, Any]]:
    lines = log_path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def access_line(log_path: Path, request_id: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        for line in json_lines(log_path):
            if line.get("logger") == "uvicorn.access" and line.get("request_id") == request_id:
                return line
        return None

    return wait_for(found, 30, what=f"the access line of request {request_id}")


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_json_logs_carry_request_and_job_ids(database_url, schema, tmp_path, how):
    args = ["--database-url", database_url, "--schema", schema]
    env = {}
    if how == "flag":
        args += ["--log-format", "json"]
    else:
        env["PGQUEUE_API_LOG_FORMAT"] = "json"
    log_path = tmp_path / "api.log"
    with api_process(args, env, log_path) as base:
        created = httpx.post(
            f"{base}/jobs", json={"task": "echo"}, headers={"X-Request-ID": "req-from-client.1"}
        )
        job_id = created.json()["id"]
        fetched = httpx.get(f"{base}/jobs/{job_id}")
        missing = httpx.get(f"{base}/jobs/999999")
        unusable = httpx.get(f"{base}/healthz", headers={"X-Request-ID": "has spaces"})

        assert created.headers["X-Request-ID"] == "req-from-client.1"
        generated = fetched.headers["X-Request-ID"]
        assert len(generated) == 32
        assert unusable.headers["X-Request-ID"] not in ("has spaces", generated)

        enqueue = access_line(log_path, "req-from-client.1")
        assert enqueue["job_id"] == job_id
        assert (enqueue["method"], enqueue["path"], enqueue["status"]) == ("POST", "/jobs", 201)
        assert enqueue["level"] == "info"
        assert {"time", "message"} <= set(enqueue)
        assert access_line(log_path, generated)["job_id"] == job_id
        lookup = access_line(log_path, missing.headers["X-Request-ID"])
        assert (lookup["job_id"], lookup["status"]) == (999999, 404)
        assert "job_id" not in access_line(log_path, unusable.headers["X-Request-ID"])
    # Every line is JSON, uvicorn's own start-up lines included.
    text = [line for line in log_path.read_text().splitlines() if line.strip()]
    start = [line for line in text if not line.startswith("{")]
    assert all(line.startswith("pgqueue-api:") for line in start), start
    assert any(line.get("logger") == "uvicorn.error" for line in json_lines(log_path))


def test_text_logs_and_answers_still_carry_the_request_id(api: httpx.Client):
    answer = api.get("/healthz", headers={"X-Request-ID": "abc"})
    assert answer.headers["X-Request-ID"] == "abc"
    refused = api.post("/jobs", content=b"{", headers={"Content-Type": "application/json"})
    assert refused.status_code == 422
    assert len(refused.headers["X-Request-ID"]) == 32


def test_an_unknown_log_format_is_a_usage_error(database_url):
    result = subprocess.run(
        [PGQUEUE_API, "--log-format", "xml", "--database-url", database_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "'xml' is not one of 'text', 'json'" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unexpected_error_is_a_500_with_its_request_id_on_a_connection_kept_open(
    database_url, schema, tmp_path, refuse_poison
):
    log_path = tmp_path / "api.log"
    args = ["--database-url", database_url, "--schema", schema, "--log-format", "json"]
    with api_process(args, {}, log_path) as base, httpx.Client(base_url=base) as client:
        failed = client.post("/jobs", json={"task": "poison"}, headers={"X-Request-ID": "boom-1"})
        assert failed.status_code == 500
        assert failed.json()["detail"] == "internal server error"
        assert failed.headers["X-Request-ID"] == "boom-1"
        # The same connection serves the next request.
        assert client.post("/jobs", json={"task": "echo"}).status_code == 201
        assert access_line(log_path, "boom-1")["status"] == 500
        reports = [
            line
            for line in json_lines(log_path)
            if line.get("request_id") == "boom-1" and line.get("level") == "error"
        ]
        assert reports and "poison row" in json.dumps(reports[0])
