"""The HTTP API driver (``pgqueue bench api``) at a tiny size on real PostgreSQL: a real
pgqueue-api and the minimal FastAPI app, side by side under wrk, every answer a 201
and every acknowledged job in its table; and the results page's section from it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from pgqueue_bench.infra.apiserver import minimal_api_server
from pgqueue_bench.report.api import api_section
from pgqueue_bench.scenarios.api import minimal_api

pytestmark = [pytest.mark.slow, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]
PGQUEUE = str(Path(sys.executable).parent / "pgqueue")


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")
def test_a_tiny_run_measures_both_apps_and_writes_the_ratios(server_url: str, tmp_path: Path):
    command = [PGQUEUE, "bench", "api", "--seconds", "1", "--warmup-seconds", "1"]
    command += ["--rounds", "2", "--connections", "2", "--threads", "1", "--batch-size", "5"]
    command += ["--database-url", server_url, "--results-dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr

    document = json.loads((tmp_path / "api.json").read_text())
    assert document["benchmark"] == "api"
    assert document["parameters"]["batch_size"] == 5
    assert [run["order"] for run in document["runs"]] == [
        ["minimal", "pgqueue-api"],
        ["pgqueue-api", "minimal"],
    ]
    for run in document["runs"]:
        for app in ("minimal", "pgqueue-api"):
            single, batch = run["apps"][app]["single"], run["apps"][app]["batch"]
            assert single["requests"] > 0 and batch["requests"] > 0, app
            assert batch["jobs_per_second"] == pytest.approx(
                5 * batch["requests_per_second"], rel=0.01
            )
            assert single["app_cpu_ms_per_request"] > 0, app
            assert single["postgres_cpu_ms_per_request"] > 0, app
        assert run["ratio"]["single_requests_per_second"] == pytest.approx(
            run["apps"]["pgqueue-api"]["single"]["requests_per_second"]
            / run["apps"]["minimal"]["single"]["requests_per_second"],
            rel=0.01,
        )
    assert document["summary"]["ratio"]["batch_jobs_per_second"]["runs"] == 2
    assert document["summary"]["ratio"]["single_cpu_per_request"]["median"] > 0
    assert "pgqueue-api / minimal app: POST /jobs" in done.stdout

    section = "\n".join(api_section(document))
    assert "| `pgqueue-api` |" in section and "| minimal FastAPI app |" in section
    single = document["summary"]["ratio"]["single_requests_per_second"]
    assert f"`POST /jobs` {single['median']:.2f}x ({single['min']:.2f}-" in section
    assert "CPU per request (the app's and PostgreSQL's together)" in section


def test_the_minimal_app_stores_what_it_acknowledges(server_url: str):
    schema = f"bench_minimal_{uuid.uuid4().hex[:8]}"
    minimal_api.create_schema(server_url, schema)
    try:
        with minimal_api_server(server_url, schema, 1) as running:
            one = httpx.post(f"{running.base_url}/jobs", json={"task": "echo", "payload": {}})
            many = httpx.post(
                f"{running.base_url}/jobs/batch",
                json={"jobs": [{"task": "echo"}, {"task": "echo", "queue": "q"}]},
            )
        assert one.status_code == 201 and one.json()["state"] == "queued"
        assert many.status_code == 201 and len(many.json()["ids"]) == 2
        assert one.json()["id"] < min(many.json()["ids"])
    finally:
        minimal_api.drop_schema(server_url, schema)
