"""The throughput driver: how fast real ``pgqueue worker`` processes drain no-op jobs.

Each run gets a fresh schema. Its worker processes are started first, and the driver
waits until every one of them has run a warm-up job, so all are connected and idle.
Then ``jobs`` no-op jobs are loaded with ``enqueue_many`` in ONE transaction: they
become visible to every worker at the same commit, whose notification releases the
workers together. The rate is the jobs divided by the time from the first job's
``started_at`` to the last one's ``finished_at``, both stamped by the database clock,
so neither process start-up nor the driver's own polling is counted.

A run is verified when every loaded job succeeded at its first attempt. Modes are
measured in turn within each repeat, so a machine that slows down during the
benchmark slows every mode alike; the summary gives the median, min and max per mode
and worker count, and each mode's speed-up over the ``skip-locked`` baseline.

Three modes of ``pgqueue worker``: its default (many jobs per claim, batched acks), and
two with one job per claim (``--concurrency 1 --prefetch 0``), as in the original
design: ``skip-locked`` claims with ``FOR UPDATE SKIP LOCKED``, ``for-update`` with a
plain ``FOR UPDATE``, under which concurrent claimers queue behind each other's row
locks. A fourth, ``naive-loop``, is what one job per claim is measured against: the
original design's table, claim and ack in a loop with nothing else around it
(:mod:`pgqueue_bench.scenarios.throughput.naive_loop`). A fifth, ``batched-ceiling``, is
what the default is measured against: that loop with a hundred jobs per claim and per
ack statement, no lease and no heartbeat
(:mod:`pgqueue_bench.scenarios.throughput.batched_ceiling`); the summary gives each
round's ratio of the default to it, the two measured one after the other. Worker counts
go from 1 to 32 processes; past the machine's core count they measure contention.

32 worker processes need about 100 connections, more than a default server allows;
``--private-server`` runs on a private cluster of the same PostgreSQL version with
room for them (:mod:`pgqueue_bench.infra.servers`), otherwise at its default settings.

Workers log at ``warning`` here: at ``info`` every job writes two log lines, and the
benchmark would measure the log formatter.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import psycopg

from pgqueue import Job, JobSpec, JobState, Queue
from pgqueue_bench import handlers, results
from pgqueue_bench.infra import database, environment
from pgqueue_bench.infra.binaries import binaries_for
from pgqueue_bench.infra.fleet import WorkerFleet, WorkerSettings, warm_up
from pgqueue_bench.infra.server_cpu import CpuSpent, server_cpu_of
from pgqueue_bench.infra.servers import PrivateServer, ServerError
from pgqueue_bench.options import database_url_option, results_dir_option
from pgqueue_bench.progress import LiveLine
from pgqueue_bench.scenarios.throughput import batched_ceiling, naive_loop, statement_stats
from pgqueue_bench.scenarios.throughput.batched_ceiling import BatchedCeilingFleet
from pgqueue_bench.scenarios.throughput.naive_loop import DrainTimes, NaiveLoopFleet
from pgqueue_bench.verdict import observe

QUEUE_NAME = "bench_throughput"
BASELINE_MODE = "skip-locked"

# Each mode is the ``WorkerSettings`` it changes from the worker's defaults.
MODES: dict[str, dict[str, Any]] = {
    # The worker as installed: its default slots and prefetch, batched claims and acks.
    "default": {},
    # One slot, nothing claimed ahead: each claim takes one job, skipping rows other
    # workers hold...
    BASELINE_MODE: {"concurrency": 1, "prefetch": 0, "claim_mode": "skip-locked"},
    # ...or waiting for them: the comparison that shows what SKIP LOCKED buys.
    "for-update": {"concurrency": 1, "prefetch": 0, "claim_mode": "for-update"},
}
# Not pgqueue workers: the original design's loop on its own table, one job at a time
# or a hundred per statement; each is the mode another is measured against.
NAIVE_LOOP_MODE = "naive-loop"
CEILING_MODE = "batched-ceiling"
LOOP_MODES: dict[str, type[NaiveLoopFleet]] = {
    NAIVE_LOOP_MODE: NaiveLoopFleet,
    CEILING_MODE: BatchedCeilingFleet,
}
LOOP_DESCRIPTIONS = {
    NAIVE_LOOP_MODE: "the original design's claim and ack, one job per loop",
    CEILING_MODE: f"the original design's table, {batched_ceiling.BATCH} jobs per claim and "
    "per ack statement, no lease, no heartbeat",
}
ALL_MODES = (*MODES, *LOOP_MODES)
# The default drain's ratio to the batched ceiling, per round, is in the summary.
DRAIN_MODE = "default"
WORKER_COUNTS = (1, 2, 4, 8, 16, 32)
QUICK_WORKER_COUNTS = (1, 2, 4)

# Room for 32 worker processes (up to four connections each) and the driver; every
# other setting is PostgreSQL's default.
PRIVATE_SERVER_SETTINGS = {"max_connections": "500", "shared_buffers": "128MB"}

WORKER_LOG_ARGUMENTS = ("--log-level", "warning")
LOAD_BATCH = 5000


@dataclass(frozen=True)
class ThroughputScenario:
    """One throughput run's shape."""

    jobs: int = 5_000
    timeout: float = 900.0
    statements: bool = False
    """Record each run's statements from pg_stat_statements (see
    :mod:`pgqueue_bench.scenarios.throughput.statement_stats`)."""

    def worker_settings(self, mode: str) -> WorkerSettings:
        """The worker's defaults, changed as ``mode`` says."""
        return WorkerSettings(
            queue=QUEUE_NAME,
            shutdown_timeout=10,
            extra_args=WORKER_LOG_ARGUMENTS,
            **MODES[mode],
        )


def _load(url: str, queue: Queue, jobs: int) -> set[int]:
    """Enqueue ``jobs`` no-op jobs in one transaction, so all appear at one commit."""
    ids: set[int] = set()
    with psycopg.connect(url, connect_timeout=10) as conn:
        for start in range(0, jobs, LOAD_BATCH):
            specs = [
                JobSpec(handlers.NOOP_TASK, {"seq": seq}, queue=QUEUE_NAME)
                for seq in range(start, min(jobs, start + LOAD_BATCH))
            ]
            ids.update(result.job.id for result in queue.enqueue_many(specs, conn=conn))
    return ids


def measure(jobs: list[Job], cpu: CpuSpent | None = None) -> dict[str, Any]:
    """Rate and verification of one run from its jobs' database timestamps, and its CPU
    per job if ``cpu`` says what the drain took."""
    started = [job.started_at for job in jobs if job.started_at is not None]
    finished = [job.finished_at for job in jobs if job.finished_at is not None]
    return rate_of(
        DrainTimes(
            jobs=len(jobs),
            first_attempt_successes=sum(
                1 for job in jobs if job.state is JobState.SUCCEEDED and job.attempts == 1
            ),
            first_started=min(started, default=None),
            last_finished=max(finished, default=None),
            cpu=cpu,
        )
    )


def rate_of(times: DrainTimes) -> dict[str, Any]:
    """Rate and verification of one run: its jobs over the time from the first start to
    the last finish; verified when every job succeeded at its first attempt."""
    seconds = (
        (times.last_finished - times.first_started).total_seconds()
        if times.first_started and times.last_finished
        else None
    )
    cpu = times.cpu
    return {
        "jobs": times.jobs,
        "seconds": seconds,
        "jobs_per_second": times.jobs / seconds if seconds else None,
        "verified": times.jobs > 0 and times.first_attempt_successes == times.jobs,
        "not_first_attempt_successes": times.jobs - times.first_attempt_successes,
        # CPU per job of the worker processes together, and of the server, from the
        # load until the last job finished: where a rate is bound by two shared cores,
        # it says what each side costs.
        "client_cpu_us_per_job": _per_job(None if cpu is None else cpu.clients, times.jobs),
        "server_cpu_us_per_job": _per_job(None if cpu is None else cpu.server, times.jobs),
    }


def _per_job(seconds: float | None, jobs: int) -> float | None:
    return None if seconds is None or not jobs else seconds / jobs * 1e6


def run_loop(
    url: str,
    scenario: ThroughputScenario,
    mode: str,
    workers: int,
    *,
    log_dir: Path,
    progress: LiveLine | None = None,
    label: str = "throughput",
) -> dict[str, Any]:
    """One measurement of the original design's loop in ``mode`` (one of
    ``LOOP_MODES``), ``workers`` processes."""
    fleet_type = LOOP_MODES[mode]
    times = naive_loop.run_naive_loop(
        url,
        QUEUE_NAME,
        scenario.jobs,
        workers,
        timeout=scenario.timeout,
        log_dir=log_dir,
        progress=progress or LiveLine(),
        label=label,
        fleet_type=fleet_type,
        before_load=(lambda: statement_stats.reset(url)) if scenario.statements else None,
    )
    return {
        "mode": mode,
        "workers": workers,
        "worker_arguments": ["python", "-m", fleet_type.loop_module],
        **rate_of(times),
        **_statements_of(url, scenario),
    }


def _statements_of(url: str, scenario: ThroughputScenario) -> dict[str, Any]:
    """The run's statements, when the scenario records them."""
    if not scenario.statements:
        return {}
    return {"statements": statement_stats.read(url, scenario.jobs)}


def run_throughput(
    url: str,
    scenario: ThroughputScenario,
    mode: str,
    workers: int,
    *,
    log_dir: Path,
    progress: LiveLine | None = None,
    label: str = "throughput",
) -> dict[str, Any]:
    """One measurement: ``workers`` processes in ``mode`` drain ``scenario.jobs`` jobs."""
    progress = progress or LiveLine()
    settings = scenario.worker_settings(mode)
    with (
        database.run_queue(url, "bench_throughput") as (schema, queue),
        WorkerFleet(url, schema, settings, log_dir) as fleet,
    ):
        fleet.start(workers)
        progress.update(f"{label}: starting {workers} workers", force=True)
        warmups = warm_up(queue, QUEUE_NAME, workers, scenario.timeout, progress, label)
        progress.update(f"{label}: loading {scenario.jobs} jobs", force=True)
        server_cpu = server_cpu_of(url)
        pids = [process.pid for process in fleet.processes]
        if scenario.statements:
            statement_stats.reset(url)
        cpu_before = CpuSpent.now(pids, server_cpu)
        measured = _load(url, queue, scenario.jobs)
        total = warmups + len(measured)

        def drained() -> bool:
            if fleet.unexpected_exits():
                raise RuntimeError(f"a worker exited:\n{fleet.log_tail()}")
            counts = observe.state_counts(queue, QUEUE_NAME)
            progress.update(f"{label}: {counts['succeeded']}/{total} succeeded")
            return observe.finished(counts) >= total

        observe.wait_for(drained, scenario.timeout, interval=0.25, what="the measured jobs")
        cpu = CpuSpent.now(pids, server_cpu).since(cpu_before)
        statements = _statements_of(url, scenario)
        progress.clear()
        jobs = [job for job in observe.all_jobs(queue) if job.id in measured]
    return {
        "mode": mode,
        "workers": workers,
        "worker_arguments": settings.arguments(),
        **measure(jobs, cpu),
        **statements,
    }


def summarize_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode and worker count, the spread of jobs/s over the verified runs and the
    median's ratio to the baseline mode's median at the same worker count."""
    medians: dict[tuple[str, int], float | None] = {}
    summary: dict[str, Any] = {}
    for mode in dict.fromkeys(run["mode"] for run in runs):
        summary[mode] = {}
        for workers in sorted({run["workers"] for run in runs if run["mode"] == mode}):
            rates = [
                run["jobs_per_second"]
                for run in runs
                if run["mode"] == mode and run["workers"] == workers and run["verified"]
            ]
            spread = results.spread(rates)
            summary[mode][str(workers)] = {"jobs_per_second": spread}
            medians[(mode, workers)] = spread["median"]
    for mode, by_workers in summary.items():
        for workers_key, entry in by_workers.items():
            baseline = medians.get((BASELINE_MODE, int(workers_key)))
            mine = medians.get((mode, int(workers_key)))
            entry[f"speedup_over_{BASELINE_MODE}"] = mine / baseline if mine and baseline else None
    if DRAIN_MODE in summary and CEILING_MODE in summary:
        for workers_key, entry in summary[DRAIN_MODE].items():
            entry[f"ratio_to_{CEILING_MODE}"] = results.spread(
                ratios_by_round(runs, DRAIN_MODE, CEILING_MODE, int(workers_key))
            )
    return summary


def ratios_by_round(
    runs: list[dict[str, Any]], mode: str, against: str, workers: int
) -> list[float]:
    """``mode``'s jobs/s over ``against``'s, one ratio per repeat that verified both at
    ``workers`` processes: the two ran one after the other, so each ratio compares them
    on the machine as it was then, and the ratios' spread is the comparison's."""
    rates: dict[tuple[int, str], float] = {
        (run["repeat"], run["mode"]): run["jobs_per_second"]
        for run in runs
        if run["workers"] == workers and run["verified"] and run.get("repeat") is not None
    }
    repeats = sorted({repeat for repeat, _ in rates})
    return [
        rates[(repeat, mode)] / rates[(repeat, against)]
        for repeat in repeats
        if (repeat, mode) in rates and (repeat, against) in rates
    ]


def _describe_run(run: dict[str, Any]) -> str:
    rate = run["jobs_per_second"]
    return (
        f"{run['mode']}, {run['workers']} worker(s): "
        f"{rate:,.0f} jobs/s ({run['jobs']} jobs in {run['seconds']:.2f} s)"
        + ("" if run["verified"] else f", NOT verified: {run['not_first_attempt_successes']} jobs")
    )


def _private_target(like_url: str | None, *, statements: bool) -> database.Target:
    """A private cluster for this command, of the same major version as ``like_url``'s
    server (or the embedded one), destroyed when the command ends; loading
    pg_stat_statements when ``statements`` asks for it."""
    chosen = {
        **PRIVATE_SERVER_SETTINGS,
        **(statement_stats.SERVER_SETTINGS if statements else {}),
    }
    server = PrivateServer(binaries_for(like_url), settings=chosen)
    server.create()
    click.get_current_context().call_on_close(server.destroy)
    try:
        server.start()
    except ServerError as exc:
        raise click.ClickException(
            f"the private cluster ({server.binaries.label}) did not start with "
            f"{', '.join(f'{k}={v}' for k, v in chosen.items())}: {exc}"
        ) from None
    settings = ", ".join(f"{name}={value}" for name, value in chosen.items())
    return database.Target(server.url(), f"private cluster, {server.binaries.label}, {settings}")


@click.command("throughput")
@click.option("--jobs", type=click.IntRange(1), default=5_000, show_default=True)
@click.option(
    "--workers",
    "worker_counts",
    type=click.IntRange(1),
    multiple=True,
    help="Worker processes (repeatable, one run per count). Default: 1, 2, 4, 8, 16, 32.",
)
@click.option(
    "--mode",
    "modes",
    type=click.Choice(ALL_MODES),
    multiple=True,
    help="Worker configuration, or naive-loop for the original design's loop, or "
    "batched-ceiling for that loop 100 jobs per statement (repeatable). Default: all.",
)
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option("--quick", is_flag=True, help="2000 jobs, one run each, 1, 2 and 4 workers.")
@click.option(
    "--private-server",
    is_flag=True,
    help="Run on a private cluster of the same PostgreSQL version with max_connections 500.",
)
@click.option(
    "--statements",
    is_flag=True,
    help="Record each run's statements from pg_stat_statements (with --private-server, "
    "a PostgreSQL that ships it, such as a system PostgreSQL 15).",
)
@database_url_option
@results_dir_option
@click.option(
    "--results-name",
    default="throughput",
    show_default=True,
    help="The results file is <results dir>/<name>.json.",
)
def throughput_command(
    jobs: int,
    worker_counts: tuple[int, ...],
    modes: tuple[str, ...],
    repeats: int,
    quick: bool,
    private_server: bool,
    statements: bool,
    database_url: str | None,
    results_dir: str | None,
    results_name: str,
) -> None:
    """Jobs per second draining pre-loaded no-op jobs, per worker mode and process count."""
    if quick:
        jobs, repeats = min(jobs, 2000), 1
    target = (
        _private_target(database_url, statements=statements)
        if private_server
        else database.resolve_target(database_url)
    )
    if statements:
        try:
            statement_stats.enable(target.url)
        except statement_stats.StatementStatsUnavailable as exc:
            raise click.ClickException(str(exc)) from None
    scenario = ThroughputScenario(jobs=jobs, statements=statements)
    modes = modes or ALL_MODES
    worker_counts = worker_counts or (QUICK_WORKER_COUNTS if quick else WORKER_COUNTS)
    runs = []
    with LiveLine() as progress:
        for repeat in range(repeats):
            for workers in worker_counts:
                for mode in modes:
                    label = f"throughput {mode} x{workers}, run {repeat + 1}/{repeats}"
                    with tempfile.TemporaryDirectory(prefix="pgqueue-throughput-") as log_dir:
                        if mode in LOOP_MODES:
                            run = run_loop(
                                target.url,
                                scenario,
                                mode,
                                workers,
                                log_dir=Path(log_dir),
                                progress=progress,
                                label=label,
                            )
                        else:
                            run = run_throughput(
                                target.url,
                                scenario,
                                mode,
                                workers,
                                log_dir=Path(log_dir),
                                progress=progress,
                                label=label,
                            )
                    runs.append({"repeat": repeat + 1, **run})
                    progress.log(_describe_run(run))
    summary = summarize_runs(runs)
    for mode, by_workers in summary.items():
        for workers, entry in by_workers.items():
            median = entry["jobs_per_second"]["median"]
            speedup = entry[f"speedup_over_{BASELINE_MODE}"]
            ceiling = entry.get(f"ratio_to_{CEILING_MODE}", {}).get("median")
            click.echo(
                f"{mode}, {workers} worker(s): median {median or 0:,.0f} jobs/s"
                + (f", {speedup:.1f}x {BASELINE_MODE}" if speedup else "")
                + (f", {ceiling:.2f}x {CEILING_MODE} (median of rounds)" if ceiling else "")
            )
    parameters = {
        **asdict(scenario),
        "repeats": repeats,
        "workers": list(worker_counts),
        "modes": {
            mode: MODES[mode] if mode in MODES else LOOP_DESCRIPTIONS[mode] for mode in modes
        },
        "worker_log_arguments": list(WORKER_LOG_ARGUMENTS),
        "rate": "jobs / (last finished_at - first started_at), database clock",
    }
    results.record(
        results_name,
        environment.describe(target.url, target.server),
        parameters=parameters,
        runs=runs,
        summary=summary,
        directory=results_dir,
        benchmark="throughput",
    )
    if any(not run["verified"] for run in runs):
        raise click.ClickException("some runs were not verified: see above")
