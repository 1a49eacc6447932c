"""Load on the HTTP API: POST /jobs and POST /jobs/batch against ``pgqueue-api --workers 2``.

Starts the real ``pgqueue-api`` process on a loopback port against a fresh schema, then:

1. single: ``--clients`` concurrent clients (default 16), each sending one POST /jobs
   at a time for ``--seconds``: requests per second and p50/p99 latency;
2. batch: ``--batch-clients`` concurrent clients (default 4, two per API worker) sending
   POST /jobs/batch with ``--batch-size`` jobs each (default 1,000) for ``--seconds``:
   jobs per second.

Every request is checked (201, and the job count in the database must match what was
acknowledged), so a fast wrong answer cannot pass for a fast answer. Results go to
``results/api.json`` with the machine, PostgreSQL and package versions.

    pgqueue bench api                      # DATABASE_URL, else the embedded server
    pgqueue bench api --seconds 5 --runs 1 # a quick look

``pgqueue bench enqueue`` drives the same endpoints with wrk for the most jobs per
second; this measures each request's latency from clients of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

import click
import httpx

from pgqueue_bench import database, environment, results
from pgqueue_bench.apiserver import api_process
from pgqueue_bench.options import database_url_option, results_dir_option

JSON = {"content-type": "application/json"}


@dataclass(frozen=True)
class Load:
    """The shape of every run: API workers, clients, batch size, phase length."""

    workers: int
    clients: int
    batch_clients: int
    batch_size: int
    seconds: float
    max_requests: int


@dataclass
class Phase:
    """What one phase measured."""

    requests: int = 0
    jobs: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float | int]:
        ordered = sorted(self.latencies)
        return {
            "requests": self.requests,
            "jobs": self.jobs,
            "seconds": round(self.seconds, 3),
            "requests_per_second": round(self.requests / self.seconds, 1),
            "jobs_per_second": round(self.jobs / self.seconds, 1),
            "latency_p50_ms": round(_percentile(ordered, 50) * 1000, 2),
            "latency_p99_ms": round(_percentile(ordered, 99) * 1000, 2),
        }


def _percentile(ordered: list[float], percent: float) -> float:
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(percent / 100 * len(ordered)) - 1))
    return ordered[index]


class HttpConnection:
    """A minimal HTTP/1.1 keep-alive client connection.

    httpx spends about a core on a few hundred requests a second, which on a 2-core
    machine would measure the client rather than the API; this writes the request bytes
    and reads the status line, headers and Content-Length body, and nothing else."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, host: str, port: int) -> HttpConnection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def post(self, head: bytes, body: bytes) -> tuple[int, bytes]:
        self.writer.write(head + body)
        await self.writer.drain()
        header_block = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = header_block.decode("latin-1").split("\r\n")
        length = 0
        for line in header_lines:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        return int(status_line.split()[1]), await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


def _request_head(port: int, path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()


async def _drive(
    port: int,
    path: str,
    body: bytes,
    jobs_per_request: int,
    clients: int,
    seconds: float,
    max_requests: int,
) -> Phase:
    """``clients`` connections, each sending ``body`` to ``path`` one request at a time,
    until the time or the request count runs out."""
    phase = Phase()
    head = _request_head(port, path, body)
    connections = [await HttpConnection.open("127.0.0.1", port) for _ in range(clients)]

    async def one_client(connection: HttpConnection) -> None:
        while time.perf_counter() < stop and phase.requests < max_requests:
            sent = time.perf_counter()
            status, answer = await connection.post(head, body)
            if status != 201:
                raise SystemExit(f"{path} answered {status}: {answer[:500]!r}")
            phase.latencies.append(time.perf_counter() - sent)
            phase.requests += 1
            phase.jobs += jobs_per_request

    start = time.perf_counter()
    stop = start + seconds
    try:
        await asyncio.gather(*(one_client(c) for c in connections))
    finally:
        for connection in connections:
            connection.close()
    phase.seconds = time.perf_counter() - start
    return phase


def _queued_jobs(port: int) -> int:
    queues = httpx.get(f"http://127.0.0.1:{port}/queues", timeout=30).json()["queues"]
    return sum(queue["counts"]["queued"] for queue in queues)


def run_once(url: str, args: Load) -> dict[str, Any]:
    """One run on a fresh schema: warm up, then the single and batch phases."""
    single_body = json.dumps({"task": "echo", "payload": {"n": 1}}).encode()
    batch_body = json.dumps(
        {"jobs": [{"task": "echo", "payload": {"n": i}} for i in range(args.batch_size)]}
    ).encode()
    with (
        database.run_schema(url, "bench_api") as schema,
        api_process(url, schema, args.workers) as port,
    ):
        warm = asyncio.run(_drive(port, "/jobs", single_body, 1, args.clients, 1.0, 500))
        single = asyncio.run(
            _drive(port, "/jobs", single_body, 1, args.clients, args.seconds, args.max_requests)
        )
        batch = asyncio.run(
            _drive(
                port,
                "/jobs/batch",
                batch_body,
                args.batch_size,
                args.batch_clients,
                args.seconds,
                args.max_requests,
            )
        )
        stored = _queued_jobs(port)
    expected = warm.jobs + single.jobs + batch.jobs
    if stored != expected:
        raise SystemExit(f"the API acknowledged {expected} jobs but the database holds {stored}")
    single_summary, batch_summary = single.summary(), batch.summary()
    return {
        # Other work on the machine shows up here: these figures are only as quiet as it was.
        "load_average_1m": round(os.getloadavg()[0], 2),
        "single": single_summary,
        "batch": batch_summary,
        "batch_to_single_ratio": round(
            batch_summary["jobs_per_second"] / single_summary["requests_per_second"], 1
        ),
    }


@click.command("api")
@click.option(
    "--workers", type=int, default=2, show_default=True, help="pgqueue-api worker processes."
)
@click.option(
    "--clients", type=int, default=16, show_default=True, help="Concurrent single-POST clients."
)
@click.option(
    "--batch-clients",
    type=int,
    default=4,
    show_default=True,
    help="Concurrent batch clients (two per API worker: one's insert overlaps the other's parsing).",
)
@click.option("--batch-size", type=int, default=1000, show_default=True, help="Jobs per batch.")
@click.option(
    "--seconds", type=float, default=10.0, show_default=True, help="Length of each phase."
)
@click.option("--max-requests", type=int, default=200_000, show_default=True, help="Cap per phase.")
@click.option(
    "--runs", type=int, default=3, show_default=True, help="Repeats, each on a fresh schema."
)
@database_url_option
@results_dir_option
def api_command(
    workers: int,
    clients: int,
    batch_clients: int,
    batch_size: int,
    seconds: float,
    max_requests: int,
    runs: int,
    database_url: str | None,
    results_dir: str | None,
) -> None:
    """Requests per second and latency of POST /jobs, and jobs per second of POST
    /jobs/batch, against pgqueue-api."""
    args = Load(workers, clients, batch_clients, batch_size, seconds, max_requests)
    target = database.resolve_target(database_url)
    done: list[dict[str, Any]] = []
    for number in range(1, runs + 1):
        run = run_once(target.url, args)
        done.append(run)
        single, batch = run["single"], run["batch"]
        click.echo(
            f"run {number}: POST /jobs {single['requests_per_second']:.0f} req/s "
            f"(p50 {single['latency_p50_ms']:.1f} ms, p99 {single['latency_p99_ms']:.1f} ms); "
            f"POST /jobs/batch {batch['jobs_per_second']:.0f} jobs/s "
            f"(p50 {batch['latency_p50_ms']:.0f} ms per batch); "
            f"ratio {run['batch_to_single_ratio']}x"
        )
    summary = {
        "single_requests_per_second": results.spread(
            r["single"]["requests_per_second"] for r in done
        ),
        "single_latency_p50_ms": results.spread(r["single"]["latency_p50_ms"] for r in done),
        "single_latency_p99_ms": results.spread(r["single"]["latency_p99_ms"] for r in done),
        "batch_jobs_per_second": results.spread(r["batch"]["jobs_per_second"] for r in done),
        "batch_to_single_ratio": results.spread(r["batch_to_single_ratio"] for r in done),
    }
    results.record(
        "api",
        environment.describe(
            target.url, target.server, "pgqueue-api", "fastapi", "uvicorn", "httpx"
        ),
        parameters={
            "api_workers": args.workers,
            "single_clients": args.clients,
            "batch_clients": args.batch_clients,
            "batch_size": args.batch_size,
            "seconds_per_phase": args.seconds,
            "max_requests_per_phase": args.max_requests,
            "client": "asyncio HTTP/1.1 keep-alive connections, one process, same machine",
        },
        runs=done,
        summary=summary,
        directory=results_dir,
    )
    ratio = summary["batch_to_single_ratio"]["median"]
    click.echo(f"median batch/single ratio {ratio}x (target: at least 20x)")
