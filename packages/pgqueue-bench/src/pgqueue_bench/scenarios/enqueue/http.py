"""The enqueue driver's HTTP cases: ``POST /jobs`` and ``POST /jobs/batch`` against a
real ``pgqueue-api`` process, driven by ``wrk`` (a C load generator, so the client
costs the server's machine little) with ``wrk_post.lua``, which counts answers and
errors; and wrk's version, for the environment block.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any, TypedDict

from psycopg import sql

from pgqueue_bench.infra import apiserver, database
from pgqueue_bench.scenarios.enqueue.outcome import Timing, count_rows, outcome
from pgqueue_bench.scenarios.enqueue.settings import (
    CASE_OVERHEAD_TIMEOUT,
    QUEUE_NAME,
    SCHEMA_PREFIX,
    TASK,
    Settings,
    Tools,
)

WRK_MARKER = "wrk-json "


class WrkErrors(TypedDict):
    """wrk's socket errors by kind, and answers with a status of 400 or more."""

    connect: int
    read: int
    write: int
    status: int
    timeout: int


class WrkLatency(TypedDict):
    """Request latency in microseconds."""

    p50: float
    p99: float
    mean: float
    max: float


class WrkCounts(TypedDict):
    """What ``wrk_post.lua`` prints after a run."""

    requests: int
    duration_us: int
    errors: WrkErrors
    latency_us: WrkLatency


def _wrk(wrk: str, port: int, path: str, body: Path, connections: int, seconds: int) -> WrkCounts:
    """One wrk run; what its script counted."""
    with resources.as_file(
        resources.files("pgqueue_bench.infra").joinpath("wrk_post.lua")
    ) as script:
        command = [wrk, "--threads", "1", "--connections", str(connections)]
        command += ["--duration", f"{seconds}s", "--timeout", "10s", "--script", str(script)]
        command += [f"http://127.0.0.1:{port}{path}", "--", str(body)]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=seconds + CASE_OVERHEAD_TIMEOUT
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith(WRK_MARKER)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"wrk exited {done.returncode}: {done.stderr.strip() or done.stdout}")
    counted: WrkCounts = json.loads(lines[-1].removeprefix(WRK_MARKER))
    return counted


def _answered(counted: WrkCounts) -> int:
    return counted["requests"] - counted["errors"]["status"]


def http_case(url: str, settings: Settings, tools: Tools, *, batch: int) -> dict[str, Any]:
    """Case ``http-*``: wrk POSTs one job to ``/jobs`` (``batch`` 1) or ``batch`` jobs
    to ``/jobs/batch`` of a real API on a fresh schema, for a warm-up and then for the
    measured run; the run's figures, verified against the jobs table with the requests
    still in flight allowed for, and requests per second and latency as wrk saw them."""
    assert tools.wrk is not None
    body: dict[str, Any]
    if batch == 1:
        path, body = "/jobs", {"task": TASK, "payload": {"seq": 0}, "queue": QUEUE_NAME}
    else:
        jobs = [{"task": TASK, "payload": {"seq": n}, "queue": QUEUE_NAME} for n in range(batch)]
        path, body = "/jobs/batch", {"jobs": jobs}
    with (
        database.run_schema(url, SCHEMA_PREFIX) as schema,
        tempfile.TemporaryDirectory(prefix="pgqueue-enqueue-") as folder,
    ):
        body_file = Path(folder) / "body.json"
        body_file.write_text(json.dumps(body))
        # Leaving the block stops the API, which finishes what is in flight first.
        with apiserver.api_process(url, schema, settings.api_workers) as port:
            load = (tools.wrk, port, path, body_file, settings.connections)
            warm = _wrk(*load, settings.wrk_warmup_seconds)
            measured = _wrk(*load, settings.wrk_seconds)
        stored = count_rows(url, sql.Identifier(schema, "jobs"))
    seconds = measured["duration_us"] / 1e6
    answered = _answered(measured)
    timing = Timing(
        jobs=answered * batch,
        calls=answered,
        seconds=seconds,
        warmup_jobs=_answered(warm) * batch,
    )
    run = outcome(timing, stored, extra_allowed=2 * settings.connections * batch)
    errors = {
        f"{phase} {kind}": number
        for phase, counted in (("warm-up", warm), ("measured", measured))
        for kind, number in counted["errors"].items()
        if number
    }
    if errors:
        run["problems"].append(f"wrk saw errors: {errors}")
        run["verified"] = False
    return {
        **run,
        "requests_per_second": answered / seconds if seconds > 0 else None,
        "latency_p50_ms": measured["latency_us"]["p50"] / 1000,
        "latency_p99_ms": measured["latency_us"]["p99"] / 1000,
        "latency_max_ms": measured["latency_us"]["max"] / 1000,
    }


def wrk_version(wrk: str | None) -> str | None:
    """The version ``wrk --version`` prints; None without wrk or when it prints none."""
    if wrk is None:
        return None
    done = subprocess.run([wrk, "--version"], capture_output=True, text=True, timeout=30)
    found = re.search(r"wrk (\S+)", done.stdout + done.stderr)
    return found.group(1) if found else None
