"""The latency driver: how long a runnable job waits before a worker claims it.

One producer enqueues no-op jobs at a fixed rate, one job per transaction, while
``workers`` real ``pgqueue worker`` processes serve the queue. A job's pickup
latency is its first claim minus the moment it became runnable,
``started_at - GREATEST(run_at, enqueued_at)``, all three stamped by the database
clock. Two wake-up modes are measured: LISTEN/NOTIFY (the worker's default) and
polling alone (``--no-listen``) every 50 ms.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from pgqueue import JobSpec, Queue
from pgqueue_bench import handlers, results
from pgqueue_bench.infra import database, environment
from pgqueue_bench.infra.fleet import WorkerFleet, WorkerSettings
from pgqueue_bench.options import database_url_option, results_dir_option
from pgqueue_bench.progress import LiveLine
from pgqueue_bench.verdict import observe

QUEUE_NAME = "bench_latency"
POLLING_INTERVAL = 0.05

# Wake-up modes: the worker flags each one runs with.
MODES: dict[str, dict[str, Any]] = {
    "listen": {"listen": True},
    "poll-50ms": {"listen": False, "poll_interval": POLLING_INTERVAL},
}


@dataclass(frozen=True)
class LatencyScenario:
    """One latency run's shape."""

    rate: float = 100.0
    jobs: int = 1000
    workers: int = 2
    concurrency: int | None = None
    warmup_jobs: int = 20
    timeout: float = 120.0

    def worker_settings(self, mode: str) -> WorkerSettings:
        """The worker's defaults plus the mode's wake-up flags, logging only warnings
        (as in the throughput driver: a log line per job is not the queue's cost)."""
        return WorkerSettings(
            queue=QUEUE_NAME,
            concurrency=self.concurrency,
            shutdown_timeout=10,
            extra_args=("--log-level", "warning"),
            **MODES[mode],
        )


def percentiles(values_ms: list[float]) -> dict[str, float]:
    """p50, p95, p99, mean and max of ``values_ms`` (linear interpolation)."""
    if len(values_ms) < 2:
        only = values_ms[0] if values_ms else float("nan")
        return {"p50": only, "p95": only, "p99": only, "mean": only, "max": only}
    cuts = statistics.quantiles(values_ms, n=100, method="inclusive")
    return {
        "p50": cuts[49],
        "p95": cuts[94],
        "p99": cuts[98],
        "mean": statistics.fmean(values_ms),
        "max": max(values_ms),
    }


def _produce(queue: Queue, scenario: LatencyScenario, progress: LiveLine, label: str) -> list[int]:
    """Enqueue ``jobs`` no-op jobs on a fixed schedule (not a fixed sleep, so the rate
    does not drift with the time each enqueue takes)."""
    ids = []
    start = time.monotonic()
    for seq in range(scenario.jobs):
        due = start + seq / scenario.rate
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        ids.append(queue.enqueue(handlers.NOOP_TASK, {"seq": seq}, queue=QUEUE_NAME).job.id)
        progress.update(f"{label}: enqueued {seq + 1}/{scenario.jobs}")
    return ids


def run_latency(
    url: str,
    scenario: LatencyScenario,
    mode: str,
    *,
    log_dir: Path,
    progress: LiveLine | None = None,
    label: str = "latency",
) -> dict[str, Any]:
    """Run one latency measurement in a fresh schema on ``url``."""
    progress = progress or LiveLine()
    with database.run_queue(url, "bench_latency") as (schema, queue):
        with WorkerFleet(url, schema, scenario.worker_settings(mode), log_dir) as fleet:
            fleet.start(scenario.workers)
            # Warm-up: every worker is up, connected and idle before measuring.
            warmup = [
                JobSpec(handlers.NOOP_TASK, {"warmup": True}, queue=QUEUE_NAME)
                for _ in range(scenario.warmup_jobs)
            ]
            warmup_ids = set(observe.enqueue_in_batches(queue, warmup))
            progress.update(f"{label}: starting {scenario.workers} workers", force=True)
            observe.wait_for(
                lambda: observe.state_counts(queue, QUEUE_NAME)["succeeded"] >= len(warmup_ids),
                scenario.timeout,
                what="the warm-up jobs",
            )
            time.sleep(1.0)
            measured = set(_produce(queue, scenario, progress, label))
            total = len(warmup_ids) + len(measured)

            def all_done() -> bool:
                fleet.require_running()
                counts = observe.state_counts(queue, QUEUE_NAME)
                progress.update(f"{label}: {counts['succeeded']}/{total} succeeded")
                return observe.finished(counts) >= total

            observe.wait_for(all_done, scenario.timeout, what="the measured jobs")
        progress.clear()
        jobs = [job for job in observe.all_jobs(queue) if job.id in measured]
    first_claims = [
        (job, started)
        for job in jobs
        if job.attempts == 1 and (started := job.started_at) is not None
    ]
    latencies_ms = [
        (started - max(job.run_at, job.enqueued_at)).total_seconds() * 1000
        for job, started in first_claims
    ]
    enqueued = sorted(job.enqueued_at for job in jobs)
    produced_rate = (
        (len(enqueued) - 1) / (enqueued[-1] - enqueued[0]).total_seconds()
        if len(enqueued) > 1
        else None
    )
    return {
        "mode": mode,
        "jobs": len(jobs),
        "jobs_claimed_more_than_once": len(jobs) - len(first_claims),
        "achieved_rate_per_second": produced_rate,
        "latency_ms": percentiles(latencies_ms),
    }


def summarize_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode, the spread over runs of each percentile."""
    summary: dict[str, Any] = {}
    for mode in dict.fromkeys(run["mode"] for run in runs):
        chosen = [run for run in runs if run["mode"] == mode]
        summary[mode] = {
            name: results.spread(run["latency_ms"][name] for run in chosen)
            for name in ("p50", "p95", "p99", "max")
        }
    return summary


def _describe_run(run: dict[str, Any]) -> str:
    lat = run["latency_ms"]
    return (
        f"{run['mode']}: p50 {lat['p50']:.2f} ms, p95 {lat['p95']:.2f} ms, "
        f"p99 {lat['p99']:.2f} ms, max {lat['max']:.1f} ms "
        f"({run['jobs']} jobs at {run['achieved_rate_per_second']:.0f}/s)"
    )


@click.command("latency")
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    default=100.0,
    show_default=True,
    help="Jobs per second.",
)
@click.option("--jobs", type=click.IntRange(2), default=1000, show_default=True)
@click.option(
    "--workers", type=click.IntRange(1), default=2, show_default=True, help="Worker processes."
)
@click.option(
    "--concurrency", type=click.IntRange(1), help="Slots per worker (default: the worker's)."
)
@click.option(
    "--mode",
    "modes",
    type=click.Choice(list(MODES)),
    multiple=True,
    help="Wake-up mode (repeatable). Default: all.",
)
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option("--quick", is_flag=True, help="300 jobs, one run per mode.")
@database_url_option
@results_dir_option
def latency_command(
    rate: float,
    jobs: int,
    workers: int,
    concurrency: int | None,
    modes: tuple[str, ...],
    repeats: int,
    quick: bool,
    database_url: str | None,
    results_dir: str | None,
) -> None:
    """Pickup latency at a fixed enqueue rate, with LISTEN/NOTIFY and with polling."""
    if quick:
        jobs, repeats = min(jobs, 300), 1
    target = database.resolve_target(database_url)
    scenario = LatencyScenario(rate=rate, jobs=jobs, workers=workers, concurrency=concurrency)
    runs = []
    with LiveLine() as progress:
        for repeat in range(repeats):
            for mode in modes or MODES:
                with tempfile.TemporaryDirectory(prefix="pgqueue-latency-") as log_dir:
                    run = run_latency(
                        target.url,
                        scenario,
                        mode,
                        log_dir=Path(log_dir),
                        progress=progress,
                        label=f"latency {mode}, run {repeat + 1}/{repeats}",
                    )
                runs.append({"repeat": repeat + 1, **run})
                progress.log(_describe_run(run))
    parameters = {
        **asdict(scenario),
        "repeats": repeats,
        "modes": {mode: scenario.worker_settings(mode).arguments() for mode in (modes or MODES)},
    }
    results.record(
        "latency",
        environment.describe(target.url, target.server),
        parameters=parameters,
        runs=runs,
        summary=summarize_runs(runs),
        directory=results_dir,
    )
