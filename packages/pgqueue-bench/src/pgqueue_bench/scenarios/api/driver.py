"""Load on the HTTP API: ``POST /jobs`` and ``POST /jobs/batch`` of ``pgqueue-api``,
side by side with the minimal FastAPI app a team would write
(:mod:`pgqueue_bench.scenarios.api.minimal_api`).

Each round starts both apps in turn, each with the same uvicorn worker count
(``--workers``, default 2) on a fresh schema, and loads each with ``wrk`` (a C load
generator, so the client costs the machine little) for two phases:

1. single: ``--connections`` connections (default 16) POSTing one job each request;
2. batch: the same connections POSTing ``--batch-size`` jobs each request (default 100).

pgqueue-api serves as it is deployed: a bearer token required, the body limit and strict
JSON on. The rounds alternate which app goes first, so a slow patch of the machine falls
on both; the ratios (pgqueue-api over the minimal app) and their spread over the rounds
are the result. For each phase also the CPU each request cost the API's processes and
the PostgreSQL server (backends, WAL writer and the rest), from their CPU times before
and after. Every answer must be a 201, and the table must hold every job acknowledged.
Results go to ``results/api.json``.

    pgqueue bench api                        # DATABASE_URL, else the embedded server
    pgqueue bench api --seconds 3 --rounds 1 # a quick look
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import click
import psutil
from psycopg import sql

from pgqueue_bench import results
from pgqueue_bench.infra import database, environment
from pgqueue_bench.infra.apiserver import RunningApi, api_server, minimal_api_server
from pgqueue_bench.infra.server_cpu import ServerCpu, processes_cpu_seconds, server_cpu_of
from pgqueue_bench.options import database_url_option, results_dir_option
from pgqueue_bench.scenarios.api import minimal_api
from pgqueue_bench.scenarios.enqueue.http import WRK_MARKER, WrkCounts, wrk_version
from pgqueue_bench.scenarios.enqueue.outcome import count_rows

PGQUEUE_API = "pgqueue-api"
MINIMAL = "minimal"
APPS = (MINIMAL, PGQUEUE_API)
QUEUE = "bench"
TASK = "echo"
WRK_OVERHEAD_TIMEOUT = 60


@dataclass(frozen=True)
class Load:
    """The shape of every phase: API workers, wrk's connections and threads, jobs per
    batch, seconds of warm-up and of measurement."""

    workers: int
    connections: int
    threads: int
    batch_size: int
    warmup_seconds: int
    seconds: int


@dataclass
class Served:
    """One app, answering: its process and the token it wants (None: none); once it
    has stopped, the jobs its table holds."""

    running: RunningApi
    token: str | None
    stored_jobs: int | None = None


def run_wrk(
    port: int, path: str, body: Path, load: Load, seconds: int, token: str | None
) -> WrkCounts:
    """One wrk run of ``wrk_post.lua`` against ``path``; what the script counted."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise click.ClickException("wrk is not installed (apt-get install wrk)")
    with resources.as_file(
        resources.files("pgqueue_bench.infra").joinpath("wrk_post.lua")
    ) as script:
        command = [wrk, "--threads", str(load.threads), "--connections", str(load.connections)]
        command += ["--duration", f"{seconds}s", "--timeout", "10s", "--script", str(script)]
        command += [f"http://127.0.0.1:{port}{path}", "--", str(body)]
        if token is not None:
            command.append(token)
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=seconds + WRK_OVERHEAD_TIMEOUT
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith(WRK_MARKER)]
    if done.returncode != 0 or not lines:
        raise click.ClickException(
            f"wrk exited {done.returncode}: {done.stderr.strip() or done.stdout}"
        )
    counted: WrkCounts = json.loads(lines[-1].removeprefix(WRK_MARKER))
    return counted


def app_cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by a uvicorn server: its supervisor and its workers."""
    with contextlib.suppress(psutil.NoSuchProcess):
        children = [child.pid for child in psutil.Process(pid).children(recursive=True)]
        return processes_cpu_seconds([pid, *children])
    return 0.0


@contextlib.contextmanager
def serve(app: str, url: str, workers: int) -> Iterator[Served]:
    """``app`` (:data:`PGQUEUE_API` or :data:`MINIMAL`) on a fresh schema, answering.
    On the way out the app stops, which lets the requests in flight finish, and then
    the jobs in its table are counted, before the schema goes."""
    if app == PGQUEUE_API:
        token = secrets.token_urlsafe(24)
        with database.run_schema(url, "bench_api") as schema:
            with api_server(url, schema, workers, tokens=[token]) as running:
                served = Served(running, token)
                yield served
            served.stored_jobs = count_rows(url, sql.Identifier(schema, "jobs"))
        return
    schema = f"bench_minimal_{secrets.token_hex(4)}"
    minimal_api.create_schema(url, schema)
    try:
        with minimal_api_server(url, schema, workers) as running:
            served = Served(running, None)
            yield served
        served.stored_jobs = count_rows(url, sql.Identifier(schema, "jobs"))
    finally:
        minimal_api.drop_schema(url, schema)


def bodies(folder: Path, batch_size: int) -> dict[str, Path]:
    """The request body of each phase, in files for wrk: both apps accept both."""
    job = {"task": TASK, "payload": {"n": 1}, "queue": QUEUE}
    batch = {
        "jobs": [{"task": TASK, "payload": {"n": n}, "queue": QUEUE} for n in range(batch_size)]
    }
    files = {"single": folder / "single.json", "batch": folder / "batch.json"}
    files["single"].write_text(json.dumps(job))
    files["batch"].write_text(json.dumps(batch))
    return files


def measure_phase(
    served: Served, server_cpu: ServerCpu | None, path: str, body: Path, jobs: int, load: Load
) -> tuple[dict[str, Any], int]:
    """A warm-up, then the measured wrk run, with the CPU the app's processes and the
    server spent in it; the phase's figures, and the jobs acknowledged (warm-up too)."""
    port, token = served.running.port, served.token
    warm = run_wrk(port, path, body, load, load.warmup_seconds, token)
    app_before = app_cpu_seconds(served.running.pid)
    server_before = server_cpu() if server_cpu is not None else None
    counted = run_wrk(port, path, body, load, load.seconds, token)
    app_spent = app_cpu_seconds(served.running.pid) - app_before
    server_spent = (
        server_cpu() - server_before
        if server_cpu is not None and server_before is not None
        else None
    )
    failures = {
        f"{name} {kind}": number
        for name, run in (("warm-up", warm), ("measured", counted))
        for kind, number in run["errors"].items()
        if number
    }
    if failures:
        raise click.ClickException(f"{path}: wrk saw errors: {failures}")
    seconds = counted["duration_us"] / 1e6
    requests = counted["requests"]
    figures = {
        "requests": requests,
        "seconds": round(seconds, 3),
        "requests_per_second": round(requests / seconds, 1),
        "jobs_per_second": round(requests * jobs / seconds, 1),
        "latency_p50_ms": round(counted["latency_us"]["p50"] / 1000, 2),
        "latency_p99_ms": round(counted["latency_us"]["p99"] / 1000, 2),
        # CPU milliseconds per request: where the time goes, which a rate alone
        # (disturbed by whatever else the machine does) does not say.
        "app_cpu_ms_per_request": round(app_spent * 1000 / requests, 4),
        "postgres_cpu_ms_per_request": (
            None if server_spent is None else round(server_spent * 1000 / requests, 4)
        ),
    }
    return figures, (warm["requests"] + requests) * jobs


def run_app(app: str, url: str, load: Load, files: dict[str, Path]) -> dict[str, Any]:
    """Both phases against ``app`` on a fresh schema, verified against its table."""
    server_cpu = server_cpu_of(url)
    with serve(app, url, load.workers) as served:
        single, single_jobs = measure_phase(served, server_cpu, "/jobs", files["single"], 1, load)
        batch, batch_jobs = measure_phase(
            served, server_cpu, "/jobs/batch", files["batch"], load.batch_size, load
        )
    stored = served.stored_jobs
    assert stored is not None  # counted once the app stopped
    acknowledged = single_jobs + batch_jobs
    # Each wrk run (a warm-up and a measured run per phase) stops with up to one request
    # per connection unanswered, which may still commit.
    in_flight = 2 * load.connections * (1 + load.batch_size)
    if not acknowledged <= stored <= acknowledged + in_flight:
        raise click.ClickException(
            f"{app} acknowledged {acknowledged} jobs but its table holds {stored}"
        )
    return {"app": app, "single": single, "batch": batch, "stored_jobs": stored}


def ratios(pgqueue: dict[str, Any], minimal: dict[str, Any]) -> dict[str, float | None]:
    """pgqueue-api's figures over the minimal app's, from one round: the rates, and the
    CPU per request of the app and PostgreSQL together (None when the server's CPU
    cannot be read), which other work on the machine disturbs far less than a rate."""

    def cpu(app: dict[str, Any], phase: str) -> float | None:
        server = app[phase]["postgres_cpu_ms_per_request"]
        return None if server is None else app[phase]["app_cpu_ms_per_request"] + server

    def over(numerator: float | None, denominator: float | None) -> float | None:
        return None if numerator is None or not denominator else round(numerator / denominator, 3)

    return {
        "single_requests_per_second": over(
            pgqueue["single"]["requests_per_second"], minimal["single"]["requests_per_second"]
        ),
        "batch_jobs_per_second": over(
            pgqueue["batch"]["jobs_per_second"], minimal["batch"]["jobs_per_second"]
        ),
        "single_cpu_per_request": over(cpu(pgqueue, "single"), cpu(minimal, "single")),
        "batch_cpu_per_request": over(cpu(pgqueue, "batch"), cpu(minimal, "batch")),
    }


RATIOS = (
    "single_requests_per_second",
    "batch_jobs_per_second",
    "single_cpu_per_request",
    "batch_cpu_per_request",
)
FIGURES = (
    "requests_per_second",
    "jobs_per_second",
    "latency_p50_ms",
    "latency_p99_ms",
    "app_cpu_ms_per_request",
    "postgres_cpu_ms_per_request",
)


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per app and phase, the spread of every figure over the rounds; and the ratios'."""
    summary: dict[str, Any] = {
        app: {
            phase: {
                figure: results.spread(r["apps"][app][phase][figure] for r in rounds)
                for figure in FIGURES
            }
            for phase in ("single", "batch")
        }
        for app in APPS
    }
    summary["ratio"] = {name: results.spread(r["ratio"][name] for r in rounds) for name in RATIOS}
    return summary


@click.command("api")
@click.option(
    "--workers",
    type=click.IntRange(1),
    default=2,
    show_default=True,
    help="uvicorn workers of each app.",
)
@click.option(
    "--connections", type=click.IntRange(1), default=16, show_default=True, help="wrk connections."
)
@click.option(
    "--threads", type=click.IntRange(1), default=2, show_default=True, help="wrk threads."
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, 1000),
    default=100,
    show_default=True,
    help="Jobs per POST /jobs/batch.",
)
@click.option(
    "--seconds", type=click.IntRange(1), default=10, show_default=True, help="Length of each phase."
)
@click.option(
    "--warmup-seconds",
    type=click.IntRange(1),
    default=2,
    show_default=True,
    help="Warm-up before each phase.",
)
@click.option(
    "--rounds",
    type=click.IntRange(1),
    default=3,
    show_default=True,
    help="Rounds, each running both apps on fresh schemas, in alternating order.",
)
@database_url_option
@results_dir_option
def api_command(
    workers: int,
    connections: int,
    threads: int,
    batch_size: int,
    seconds: int,
    warmup_seconds: int,
    rounds: int,
    database_url: str | None,
    results_dir: str | None,
) -> None:
    """Requests per second, latency and CPU per request of POST /jobs and POST
    /jobs/batch of pgqueue-api, side by side with a minimal FastAPI app."""
    load = Load(workers, connections, threads, batch_size, warmup_seconds, seconds)
    target = database.resolve_target(database_url)
    done: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pgqueue-api-bench-") as folder:
        files = bodies(Path(folder), batch_size)
        for number in range(1, rounds + 1):
            order = APPS if number % 2 else APPS[::-1]
            apps = {app: run_app(app, target.url, load, files) for app in order}
            ratio = ratios(apps[PGQUEUE_API], apps[MINIMAL])
            done.append(
                {
                    "round": number,
                    "order": list(order),
                    # Other work on the machine shows up here.
                    "load_average_1m": round(os.getloadavg()[0], 2),
                    "apps": apps,
                    "ratio": ratio,
                }
            )
            for app in APPS:
                single, batch = apps[app]["single"], apps[app]["batch"]
                click.echo(
                    f"round {number} {app:>11}: POST /jobs {single['requests_per_second']:,.0f} "
                    f"req/s (p99 {single['latency_p99_ms']:.1f} ms, "
                    f"{single['app_cpu_ms_per_request']:.3f} ms app CPU, "
                    f"{single['postgres_cpu_ms_per_request'] or 0:.3f} ms PostgreSQL CPU); "
                    f"POST /jobs/batch {batch['jobs_per_second']:,.0f} jobs/s"
                )
            click.echo(
                f"round {number} ratio: POST /jobs {ratio['single_requests_per_second']}x "
                f"(CPU per request {ratio['single_cpu_per_request']}x), "
                f"POST /jobs/batch {ratio['batch_jobs_per_second']}x "
                f"(CPU per request {ratio['batch_cpu_per_request']}x)"
            )
    summary = summarise(done)
    results.record(
        "api",
        environment.describe(
            target.url,
            target.server,
            "pgqueue-api",
            "fastapi",
            "starlette",
            "pydantic",
            "uvicorn",
            wrk=wrk_version(shutil.which("wrk")),
        ),
        parameters={
            "api_workers": load.workers,
            "wrk_connections": load.connections,
            "wrk_threads": load.threads,
            "batch_size": load.batch_size,
            "seconds_per_phase": load.seconds,
            "warmup_seconds": load.warmup_seconds,
            "rounds": rounds,
            "pgqueue_api": "a bearer token required, body limit and strict JSON on, "
            "default pool size",
            "minimal": "pgqueue_bench.scenarios.api.minimal_api: one pydantic model, an async "
            f"pool of {minimal_api.POOL_SIZE} autocommit connections, one prepared INSERT ... "
            "RETURNING",
        },
        runs=done,
        summary=summary,
        directory=results_dir,
    )
    single = summary["ratio"]["single_requests_per_second"]
    batch = summary["ratio"]["batch_jobs_per_second"]
    click.echo(
        f"pgqueue-api / minimal app: POST /jobs {single['median']:.2f}x "
        f"({single['min']:.2f}-{single['max']:.2f}), POST /jobs/batch {batch['median']:.2f}x "
        f"({batch['min']:.2f}-{batch['max']:.2f})"
    )
