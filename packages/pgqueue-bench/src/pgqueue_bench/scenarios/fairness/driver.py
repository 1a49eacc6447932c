"""The fairness driver: a noisy neighbour against real ``pgqueue worker`` processes.

One large tenant puts a backlog of ``big_jobs`` into the queue in one transaction;
right after it, ``small_tenants`` small tenants each enqueue jobs at ``small_rate``
per second, one job per transaction, for as long as the backlog has jobs no worker
has claimed yet (so that every small job meets it), at most ``small_jobs`` each.
Every job's handler sleeps
``job_ms`` milliseconds (the ``bench_sleep`` task), so the backlog takes a while to
drain. ``workers`` worker processes with their default flags (logging warnings only,
as in the throughput driver) serve the queue. Each phase runs on a fresh schema with
fresh workers, warmed up first:

- ``fifo``: no partition keys, so the small tenants' jobs wait behind the backlog;
- ``fair-share``: the same jobs with ``partition_key`` = the tenant, so each claim
  takes the keys round-robin;
- ``partition-limit``: as ``fair-share``, on a queue whose
  ``partition_concurrency_limit`` is ``partition_limit``;
- ``alone``: the baseline, each small tenant's trickle of ``small_jobs`` by itself
  (one tenant after the other, each once the previous one's jobs finished), with its
  partition key, no backlog.

A job's pickup latency is ``started_at - GREATEST(run_at, enqueued_at)``, both on the
database clock. ``started_at`` is the claim, and the worker claims ahead of its free
slots what they should start within 0.1 s, so a job may wait a little longer in the
worker: its handler notes when it started (:func:`pgqueue_bench.handlers.handler_starts`),
on this machine's clock, set to the database's by an offset read before the backlog,
and each pickup figure has a twin to the handler's start. A run's rate is all its jobs
over the time from the first job's start to the last one's finish. A run is verified when every
job succeeded at its first attempt. The phases take turns within each repeat, each
repeat starting with the next one; the summary (:mod:`pgqueue_bench.scenarios.fairness.summary`)
pairs the phases within each repeat for the ratios the targets are held to.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import psycopg

from pgqueue import Job, JobSpec, JobState, Queue
from pgqueue_bench import handlers, results
from pgqueue_bench.charts.fairness import plot_fairness
from pgqueue_bench.infra import database, environment
from pgqueue_bench.infra.fleet import WorkerFleet, WorkerSettings, warm_up
from pgqueue_bench.options import database_url_option, results_dir_option
from pgqueue_bench.progress import LiveLine
from pgqueue_bench.scenarios.fairness.summary import (
    ALONE,
    BIG_TENANT,
    FAIR_SHARE,
    FIFO,
    PARTITION_LIMIT,
    PHASES,
    describe_target,
    summarize,
)
from pgqueue_bench.scenarios.latency import percentiles
from pgqueue_bench.sql.queries import one_row, statement
from pgqueue_bench.verdict import observe

QUEUE_NAME = "bench_fairness"
LOAD_BATCH = 5000
WORKER_LOG_ARGUMENTS = ("--log-level", "warning")
# How often the trickle asks whether the backlog still has unclaimed jobs: seldom
# enough that asking costs the server next to nothing beside the drain it measures.
BACKLOG_CHECK_SECONDS = 0.2


@dataclass(frozen=True)
class FairnessScenario:
    """One fairness run's shape."""

    workers: int = 2
    concurrency: int | None = None
    job_ms: float = 5.0
    big_jobs: int = 20_000
    small_tenants: int = 4
    small_jobs: int = 100
    small_rate: float = 20.0
    partition_limit: int = 16
    timeout: float = 900.0

    @property
    def small(self) -> list[str]:
        """The small tenants' names, which are also their partition keys."""
        return [f"small-{n}" for n in range(1, self.small_tenants + 1)]

    def worker_settings(self) -> WorkerSettings:
        """The worker's defaults (slots, prefetch, LISTEN), logging only warnings."""
        return WorkerSettings(
            queue=QUEUE_NAME,
            concurrency=self.concurrency,
            shutdown_timeout=10,
            extra_args=WORKER_LOG_ARGUMENTS,
        )

    def job(self, tenant: str, seq: int, *, keyed: bool) -> JobSpec:
        """Job ``seq`` of ``tenant``: a sleep of ``job_ms``, keyed by its tenant or not."""
        return JobSpec(
            handlers.SLEEP_TASK,
            {"tenant": tenant, "seq": seq, "sleep_ms": self.job_ms},
            queue=QUEUE_NAME,
            partition_key=tenant if keyed else None,
        )


def _load_backlog(url: str, queue: Queue, scenario: FairnessScenario, *, keyed: bool) -> set[int]:
    """The large tenant's backlog in one transaction, so all of it appears at once."""
    ids: set[int] = set()
    with psycopg.connect(url, connect_timeout=10) as conn:
        for start in range(0, scenario.big_jobs, LOAD_BATCH):
            specs = [
                scenario.job(BIG_TENANT, seq, keyed=keyed)
                for seq in range(start, min(scenario.big_jobs, start + LOAD_BATCH))
            ]
            ids.update(result.job.id for result in queue.enqueue_many(specs, conn=conn))
    return ids


def _backlog_queued(queue: Queue) -> bool:
    """Whether the large tenant still has a job no worker has claimed (found through
    the queued jobs' index, in milliseconds however long the backlog)."""
    page = queue.list(
        queue=QUEUE_NAME, state="queued", payload_contains={"tenant": BIG_TENANT}, limit=1
    )
    return bool(page.jobs)


def _trickle(
    queue: Queue,
    scenario: FairnessScenario,
    tenants: list[str],
    *,
    keyed: bool,
    progress: LiveLine,
    label: str,
    while_backlog: bool = False,
) -> set[int]:
    """Each of ``tenants`` enqueues up to ``small_jobs`` jobs at ``small_rate`` per
    second, one per transaction, the tenants' schedules staggered evenly; with
    ``while_backlog``, only until the large tenant's jobs are all claimed, as seen every
    :data:`BACKLOG_CHECK_SECONDS` (but one job each at least). Due times are fixed from the start (not pauses), so the rate does
    not drift with the enqueues' time."""
    schedule = sorted(
        ((seq + index / len(tenants)) / scenario.small_rate, tenant, seq)
        for index, tenant in enumerate(tenants)
        for seq in range(scenario.small_jobs)
    )
    ids: set[int] = set()
    start = checked = time.monotonic()
    for due, tenant, seq in schedule:
        pause = start + due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        if while_backlog and seq > 0 and time.monotonic() - checked >= BACKLOG_CHECK_SECONDS:
            if not _backlog_queued(queue):
                break
            checked = time.monotonic()
        spec = scenario.job(tenant, seq, keyed=keyed)
        ids.add(queue.enqueue_many([spec])[0].job.id)
        progress.update(f"{label}: {len(ids)}/{len(schedule)} small tenants' jobs enqueued")
    return ids


def _wait_finished(
    queue: Queue,
    fleet: WorkerFleet,
    total: int,
    scenario: FairnessScenario,
    progress: LiveLine,
    label: str,
) -> None:
    """Wait until ``total`` jobs of the queue (the warm-up's included) are final."""

    def finished() -> bool:
        fleet.require_running()
        counts = observe.state_counts(queue, QUEUE_NAME)
        progress.update(f"{label}: {counts['succeeded']}/{total} succeeded")
        return observe.finished(counts) >= total

    observe.wait_for(finished, scenario.timeout, interval=0.1, what="the measured jobs")


def clock_offset(url: str) -> float:
    """Seconds to add to this machine's clock to read the database's: the database's
    now() against the middle of the round trip that read it."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(statement("database_now"))  # connected and warm before the reading
        before = time.time()
        now = one_row(conn.execute(statement("database_now")))[0]
        after = time.time()
    return float(now.timestamp() - (before + after) / 2)


def _tenant(job: Job) -> str:
    return str(job.payload["tenant"])


def _pickup_ms(job: Job) -> float | None:
    if job.started_at is None:
        return None
    return (job.started_at - max(job.run_at, job.enqueued_at)).total_seconds() * 1000


def _to_start_ms(job: Job, starts: dict[int, float], offset: float) -> float | None:
    started = starts.get(job.id)
    if started is None:
        return None
    return (started + offset - max(job.run_at, job.enqueued_at).timestamp()) * 1000


def _latencies(jobs: list[Job], tenants: list[str], value: Any) -> dict[str, list[float]]:
    by_tenant: dict[str, list[float]] = {tenant: [] for tenant in tenants}
    for job in jobs:
        measured = value(job)
        if measured is not None:
            by_tenant.setdefault(_tenant(job), []).append(measured)
    return by_tenant


def _small(by_tenant: dict[str, list[float]]) -> list[float]:
    return [
        value for tenant, values in by_tenant.items() if tenant != BIG_TENANT for value in values
    ]


def run_figures(
    jobs: list[Job], tenants: Iterable[str], starts: dict[int, float], offset: float
) -> dict[str, Any]:
    """What one run measured: per tenant, and for the small tenants together, the
    percentiles of the pickup latencies, and of the times to the handler's start (from
    ``starts``, on this machine's clock, which ``offset`` sets to the database's); the
    rate over all jobs; whether every job succeeded at its first attempt; and, with a
    backlog, how long it took to drain and the share of the small tenants' jobs
    enqueued before its last job started."""
    names = list(tenants)
    by_tenant = _latencies(jobs, names, _pickup_ms)
    to_start = _latencies(jobs, names, lambda job: _to_start_ms(job, starts, offset))
    small = _small(by_tenant)
    started = [job.started_at for job in jobs if job.started_at is not None]
    finished = [job.finished_at for job in jobs if job.finished_at is not None]
    seconds = (max(finished) - min(started)).total_seconds() if started and finished else None
    good = sum(1 for job in jobs if job.state is JobState.SUCCEEDED and job.attempts == 1)
    figures: dict[str, Any] = {
        "jobs": len(jobs),
        "seconds": seconds,
        "jobs_per_second": len(jobs) / seconds if seconds else None,
        "verified": bool(jobs) and good == len(jobs),
        "not_first_attempt_successes": len(jobs) - good,
        "tenants": {
            tenant: {
                "jobs": len(values),
                "latency_ms": percentiles(values),
                "to_handler_start_ms": percentiles(to_start.get(tenant, [])),
            }
            for tenant, values in by_tenant.items()
            if values
        },
        "small_tenants": {
            "jobs": len(small),
            "latency_ms": percentiles(small),
            "to_handler_start_ms": percentiles(_small(to_start)),
        },
        "handler_starts_noted": sum(len(values) for values in to_start.values()),
        "clock_offset_seconds": offset,
    }
    big = [job for job in jobs if _tenant(job) == BIG_TENANT]
    big_started = [job.started_at for job in big if job.started_at is not None]
    big_finished = [job.finished_at for job in big if job.finished_at is not None]
    if big_started and big_finished:
        last_start = max(big_started)
        small_jobs = [job for job in jobs if _tenant(job) != BIG_TENANT]
        figures["backlog_seconds"] = (max(big_finished) - min(big_started)).total_seconds()
        figures["small_jobs_enqueued_during_backlog"] = (
            sum(1 for job in small_jobs if job.enqueued_at <= last_start) / len(small_jobs)
            if small_jobs
            else None
        )
    return figures


def run_contended(
    url: str,
    scenario: FairnessScenario,
    phase: str,
    *,
    log_dir: Path,
    progress: LiveLine,
    label: str,
) -> dict[str, Any]:
    """One run of ``phase`` (fifo, fair-share or partition-limit): the backlog, then
    the small tenants' trickle, on a fresh schema with fresh workers."""
    keyed = phase != FIFO
    with (
        database.run_queue(url, "bench_fairness") as (schema, queue),
        WorkerFleet(url, schema, scenario.worker_settings(), log_dir) as fleet,
    ):
        if phase == PARTITION_LIMIT:
            queue.update_queue(
                QUEUE_NAME, partition_concurrency_limit=scenario.partition_limit, create=True
            )
        fleet.start(scenario.workers)
        warmups = warm_up(queue, QUEUE_NAME, scenario.workers, scenario.timeout, progress, label)
        offset = clock_offset(url)
        progress.update(f"{label}: loading {scenario.big_jobs} jobs", force=True)
        measured = _load_backlog(url, queue, scenario, keyed=keyed)
        measured |= _trickle(
            queue,
            scenario,
            scenario.small,
            keyed=keyed,
            progress=progress,
            label=label,
            while_backlog=True,
        )
        _wait_finished(queue, fleet, warmups + len(measured), scenario, progress, label)
        progress.clear()
        jobs = [job for job in observe.all_jobs(queue) if job.id in measured]
    starts = handlers.handler_starts(log_dir)
    return {"phase": phase, **run_figures(jobs, [BIG_TENANT, *scenario.small], starts, offset)}


def run_alone(
    url: str, scenario: FairnessScenario, *, log_dir: Path, progress: LiveLine, label: str
) -> dict[str, Any]:
    """The baseline: each small tenant's trickle by itself, keyed, no backlog; one
    tenant after another on the same workers, each once the previous one's finished."""
    with (
        database.run_queue(url, "bench_fairness") as (schema, queue),
        WorkerFleet(url, schema, scenario.worker_settings(), log_dir) as fleet,
    ):
        fleet.start(scenario.workers)
        total = warm_up(queue, QUEUE_NAME, scenario.workers, scenario.timeout, progress, label)
        offset = clock_offset(url)
        measured: set[int] = set()
        for tenant in scenario.small:
            ids = _trickle(queue, scenario, [tenant], keyed=True, progress=progress, label=label)
            measured |= ids
            total += len(ids)
            _wait_finished(queue, fleet, total, scenario, progress, label)
        progress.clear()
        jobs = [job for job in observe.all_jobs(queue) if job.id in measured]
    figures = run_figures(jobs, scenario.small, handlers.handler_starts(log_dir), offset)
    # The tenants ran one after another, with pauses between: no rate to speak of.
    figures.update(seconds=None, jobs_per_second=None)
    return {"phase": ALONE, **figures}


def _describe_run(run: dict[str, Any]) -> str:
    small = run["small_tenants"]["latency_ms"]
    text = f"{run['phase']:>15}: small tenants' pickup p50 {small['p50']:.1f} ms, p99 {small['p99']:.1f} ms"
    if run["jobs_per_second"]:
        text += (
            f"; {run['jobs_per_second']:,.0f} jobs/s ({run['jobs']} jobs in {run['seconds']:.1f} s)"
        )
    if run.get("backlog_seconds") is not None:
        big = run["tenants"][BIG_TENANT]["latency_ms"]
        text += f"; large tenant p50 {big['p50']:.0f} ms"
    text += f"; load {run['load_average_1m']}"
    if not run["verified"]:
        text += f"; NOT verified: {run['not_first_attempt_successes']} jobs"
    return text


def _phase_descriptions(scenario: FairnessScenario) -> dict[str, str]:
    return {
        ALONE: "each small tenant's trickle by itself, with its partition key, no backlog",
        FIFO: "backlog and trickle, no partition keys",
        FAIR_SHARE: "backlog and trickle, partition_key = tenant",
        PARTITION_LIMIT: "backlog and trickle, partition_key = tenant, queue "
        f"partition_concurrency_limit {scenario.partition_limit}",
    }


@click.command("fairness")
@click.option(
    "--big-jobs",
    type=click.IntRange(1),
    default=20_000,
    show_default=True,
    help="The large tenant's backlog.",
)
@click.option(
    "--small-tenants",
    type=click.IntRange(1, 100),
    default=4,
    show_default=True,
    help="Small tenants.",
)
@click.option(
    "--small-jobs",
    type=click.IntRange(2),
    default=100,
    show_default=True,
    help="Jobs each small tenant enqueues alone; beside the backlog, the most it enqueues "
    "while the backlog lasts.",
)
@click.option(
    "--small-rate",
    type=click.FloatRange(min=0, min_open=True),
    default=20.0,
    show_default=True,
    help="Jobs per second each small tenant enqueues.",
)
@click.option(
    "--job-ms",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="How long every job's handler sleeps.",
)
@click.option(
    "--workers", type=click.IntRange(1), default=2, show_default=True, help="Worker processes."
)
@click.option(
    "--concurrency", type=click.IntRange(1), help="Slots per worker (default: the worker's)."
)
@click.option(
    "--partition-limit",
    type=click.IntRange(1),
    default=16,
    show_default=True,
    help="The queue's partition_concurrency_limit in the partition-limit phase.",
)
@click.option(
    "--phase",
    "phases",
    type=click.Choice(PHASES),
    multiple=True,
    help="Phase to run (repeatable). Default: all.",
)
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option(
    "--quick", is_flag=True, help="A 2,000-job backlog, 10 jobs per small tenant, one run."
)
@database_url_option
@results_dir_option
@click.option(
    "--results-name",
    default="fairness",
    show_default=True,
    help="The results file is <results dir>/<name>.json.",
)
def fairness_command(
    big_jobs: int,
    small_tenants: int,
    small_jobs: int,
    small_rate: float,
    job_ms: float,
    workers: int,
    concurrency: int | None,
    partition_limit: int,
    phases: tuple[str, ...],
    repeats: int,
    quick: bool,
    database_url: str | None,
    results_dir: str | None,
    results_name: str,
) -> None:
    """Small tenants' pickup latency and the drain rate beside a large tenant's backlog.

    Phases: FIFO, fair share by partition key, fair share with a per-key limit, and each
    small tenant alone. Writes <name>.json and its chart, <name>.png."""
    if quick:
        big_jobs, small_jobs, repeats = min(big_jobs, 2000), min(small_jobs, 10), 1
    scenario = FairnessScenario(
        workers=workers,
        concurrency=concurrency,
        job_ms=job_ms,
        big_jobs=big_jobs,
        small_tenants=small_tenants,
        small_jobs=small_jobs,
        small_rate=small_rate,
        partition_limit=partition_limit,
    )
    chosen = [phase for phase in PHASES if phase in phases] if phases else list(PHASES)
    target = database.resolve_target(database_url)
    env = environment.describe(target.url, target.server)
    runs = []
    with LiveLine() as progress:
        for repeat in range(repeats):
            # Each repeat starts with the next phase, so that none always runs first.
            turn = repeat % len(chosen)
            for phase in chosen[turn:] + chosen[:turn]:
                label = f"fairness {phase}, run {repeat + 1}/{repeats}"
                with tempfile.TemporaryDirectory(prefix="pgqueue-fairness-") as log_dir:
                    if phase == ALONE:
                        run = run_alone(
                            target.url,
                            scenario,
                            log_dir=Path(log_dir),
                            progress=progress,
                            label=label,
                        )
                    else:
                        run = run_contended(
                            target.url,
                            scenario,
                            phase,
                            log_dir=Path(log_dir),
                            progress=progress,
                            label=label,
                        )
                # Other work on the machine moves every figure: say how busy it was.
                run["load_average_1m"] = round(os.getloadavg()[0], 2)
                runs.append({"repeat": repeat + 1, **run})
                progress.log(_describe_run(run))
    summary = summarize(runs)
    for target_figure in summary["targets"]:
        click.echo(describe_target(target_figure))
    parameters = {
        **asdict(scenario),
        "small_tenant_names": scenario.small,
        "big_tenant_name": BIG_TENANT,
        "repeats": repeats,
        "phases": {phase: _phase_descriptions(scenario)[phase] for phase in chosen},
        "worker_arguments": scenario.worker_settings().arguments(),
        "pickup": "started_at - GREATEST(run_at, enqueued_at), database clock",
        "rate": "jobs / (last finished_at - first started_at), database clock",
    }
    document = results.document(
        "fairness", environment=env, parameters=parameters, runs=runs, summary=summary
    )
    path = results.write(results_name, document, results_dir)
    click.echo(f"wrote {path}")
    for chart in plot_fairness(document, path.with_suffix(".png")):
        click.echo(f"wrote {chart}")
    if any(not run["verified"] for run in runs):
        raise click.ClickException("some runs were not verified: see above")
