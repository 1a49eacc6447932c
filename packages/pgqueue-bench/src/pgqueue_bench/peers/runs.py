"""One side-by-side run of one system, each on a fresh database: the throughput drain
and the latency scenario, and the check that every job completed exactly once.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from pgqueue_bench.infra import database, server_cpu
from pgqueue_bench.peers.systems import System
from pgqueue_bench.peers.workers import Workers
from pgqueue_bench.scenarios.latency import percentiles


def verify(
    seen: list[int], jobs: int, report: dict[str, Any], partition_keys: int | None = None
) -> list[str]:
    """Why a run does not count, or nothing if every job completed exactly once (and,
    given ``partition_keys``, the jobs carried that many keys, as the system's report
    counts them)."""
    problems = []
    if partition_keys is not None and report.get("partition_keys") != partition_keys:
        problems.append(
            f"the jobs carried {report.get('partition_keys')} partition keys, not {partition_keys}"
        )
    if sorted(seen) != list(range(jobs)):
        missing = jobs - len(set(seen) & set(range(jobs)))
        problems.append(f"{missing} jobs never ran, {len(seen) - len(set(seen))} ran twice")
    if report["completed"] != jobs:
        problems.append(f"the tables say {report['completed']} of {jobs} jobs completed")
    if report["most_starts_of_one_job"] > 1:
        problems.append("the tables say some job was started more than once")
    return problems


def throughput_run(
    system: System,
    server_url: str,
    jobs: int,
    workers: int,
    timeout: float,
    sleep_ms: float = 0.0,
    postmaster: int | None = None,
) -> dict[str, Any]:
    """Drain ``jobs`` pre-loaded jobs with ``workers`` processes; the rate and checks.
    With ``sleep_ms``, each job's handler awaits ``asyncio.sleep`` of that long.

    The CPU the drain cost, per job: the worker processes' from their first job to
    their exit (see ``peerlib.ran``), and, given the ``postmaster`` of a server on this
    machine, the server's from the start barrier until the workers' backends are gone.
    Other programs on the machine slow a run's rate far more than its CPU seconds."""
    database_name = f"bench_peer_{system.slug}"
    server_seconds = None
    with (
        database.fresh_database(server_url, database_name) as url,
        tempfile.TemporaryDirectory(prefix="pgqueue-peers-") as folder,
    ):
        system.run("setup", "--database-url", url)
        system.run(
            "enqueue", "--database-url", url, "--jobs", str(jobs), *system.enqueue_setting_args()
        )
        fleet = Workers(system, url, workers, Path(folder), drain=True, sleep_ms=sleep_ms)
        try:
            fleet.wait_until_ready()
            server_before = server_cpu_seconds(postmaster)
            fleet.go()
            fleet.wait(timeout)
            if postmaster is not None and server_before is not None:
                wait_for_backends_to_leave(postmaster, database_name)
                server_seconds = server_cpu.postgres_cpu_seconds(postmaster) - server_before
        finally:
            fleet.kill()
        worker_cpu = fleet.cpu_seconds()
        report = system.report(url)
        keys = system.enqueue_settings.get("partition_keys")
        # The jobs take the keys in turn: fewer jobs than keys use as many keys as jobs.
        expected_keys = None if keys is None else min(int(keys), jobs)
        problems = verify(fleet.seen(), jobs, report, expected_keys)
    seconds = report["seconds"]
    cpu = None if worker_cpu is None or server_seconds is None else worker_cpu + server_seconds
    return {
        "scenario": "throughput",
        "system": system.name,
        "workers": workers,
        "jobs": jobs,
        "sleep_ms": sleep_ms,
        "seconds": seconds,
        "jobs_per_second": jobs / seconds if seconds else None,
        "worker_cpu_seconds": worker_cpu,
        "server_cpu_seconds": server_seconds,
        "cpu_us_per_job": None if cpu is None else cpu / jobs * 1e6,
        "verified": not problems,
        "problems": problems,
    }


def server_cpu_seconds(postmaster: int | None) -> float | None:
    """The server's CPU seconds so far, or None for a server not on this machine."""
    return None if postmaster is None else server_cpu.postgres_cpu_seconds(postmaster)


def wait_for_backends_to_leave(postmaster: int, database_name: str, timeout: float = 10) -> None:
    """Wait until no backend serves ``database_name``: the time of a backend that has
    exited counts once the postmaster has reaped it."""
    deadline = time.monotonic() + timeout
    while server_cpu.backends_of(postmaster, database_name) and time.monotonic() < deadline:
        time.sleep(0.05)


def latency_run(
    system: System, server_url: str, jobs: int, rate: float, workers: int, timeout: float
) -> dict[str, Any]:
    """Pickup latency of ``jobs`` jobs enqueued at ``rate`` per second."""
    with (
        database.fresh_database(server_url, f"bench_peer_{system.slug}") as url,
        tempfile.TemporaryDirectory(prefix="pgqueue-peers-") as folder,
    ):
        system.run("setup", "--database-url", url)
        fleet = Workers(system, url, workers, Path(folder), drain=False)
        try:
            fleet.release()
            time.sleep(1.0)  # let every worker settle into waiting for jobs
            system.run(
                "produce", "--database-url", url, "--jobs", str(jobs), "--rate", str(rate),
                timeout=timeout,
            )  # fmt: skip
            deadline = time.monotonic() + timeout
            while system.report(url)["completed"] < jobs and time.monotonic() < deadline:
                time.sleep(0.5)
            fleet.stop()
        finally:
            fleet.kill()
        report = system.report(url, latencies=True)
        problems = verify(fleet.seen(), jobs, report)
    return {
        "scenario": "latency",
        "system": system.name,
        "workers": workers,
        "jobs": jobs,
        "rate": rate,
        "latency_ms": percentiles(report["latencies_ms"]),
        "verified": not problems,
        "problems": problems,
    }
