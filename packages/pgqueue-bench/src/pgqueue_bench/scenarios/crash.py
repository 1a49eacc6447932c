"""The crash driver: real workers SIGKILLed at random while they work, and proof that
every job still succeeded.

Jobs run ``bench_record_delivery``, which commits a delivery row before 10-50 ms of
work. Every ``kill_interval`` seconds a random worker gets SIGKILL and a replacement
starts. A killed worker's leases expire after ``lease_seconds``; the reaper puts its
jobs back, and another worker runs them again. At the end the jobs table and the
delivery rows say how many jobs succeeded, how many were never delivered, and how
many were delivered more than once (at-least-once allows duplicates, never loss).

With ``dependencies`` (``--dependencies``), each ten jobs are a small graph: the ninth
waits for the first eight, the tenth for the ninth. The run then also checks that no dependent was delivered before all its
dependencies had succeeded, and that no waiting job was counted down twice.
"""

from __future__ import annotations

import dataclasses
import random
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import psycopg
from psycopg.rows import dict_row

from pgqueue import BatchItem, JobSpec, Queue
from pgqueue_bench import handlers, results
from pgqueue_bench.infra import database, environment
from pgqueue_bench.infra.fleet import WorkerFleet, WorkerSettings
from pgqueue_bench.options import database_url_option, results_dir_option
from pgqueue_bench.progress import LiveLine
from pgqueue_bench.sql.queries import one_row, schema_statement
from pgqueue_bench.verdict import observe

QUEUE_NAME = "bench_crash"


@dataclass(frozen=True)
class CrashScenario:
    """One crash run's shape. ``kills=None`` keeps killing until every job finished."""

    jobs: int = 1000
    workers: int = 6
    concurrency: int = 2
    lease_seconds: float = 1.0
    kill_interval: float = 0.3
    kills: int | None = None
    # "any": a random running worker; "busy": a random one of those holding a job
    # (any worker when none is), so that every kill leaves a lease to expire.
    victims: str = "any"
    work_ms: tuple[int, int] = handlers.DEFAULT_WORK_MS
    # Generous, so that a job unlucky enough to be killed many times is retried
    # rather than dead-lettered: this run is about loss, not about retry policy.
    max_attempts: int = 25
    timeout: float = 300.0
    seed: int | None = None
    # Jobs in groups of DEPENDENCY_GROUP that wait for each other (see the module's
    # docstring).
    dependencies: bool = False

    def worker_settings(self) -> WorkerSettings:
        """Short lease and reap intervals, so lost leases come back within a second."""
        return WorkerSettings(
            queue=QUEUE_NAME,
            concurrency=self.concurrency,
            lease_seconds=self.lease_seconds,
            heartbeat_seconds=round(self.lease_seconds / 3, 3),
            reap_interval=round(self.lease_seconds / 2, 3),
            poll_interval=0.2,
            retry_base=0.1,
            retry_cap=1.0,
            shutdown_timeout=10,
        )


DEPENDENCY_GROUP = 10


def _enqueue_with_dependencies(queue: Queue, specs: list[JobSpec]) -> None:
    """``specs`` in groups of DEPENDENCY_GROUP, one enqueue_many each: in a group, the
    second to last job waits for those before it, the last for the second to last."""
    for start in range(0, len(specs), DEPENDENCY_GROUP):
        group = specs[start : start + DEPENDENCY_GROUP]
        if len(group) >= 3:
            fan_in = len(group) - 2
            group[-2] = dataclasses.replace(
                group[-2], depends_on=[BatchItem(i) for i in range(fan_in)]
            )
            group[-1] = dataclasses.replace(group[-1], depends_on=[BatchItem(fan_in)])
        queue.enqueue_many(group)


def _dependency_figures(url: str, schema: str) -> dict[str, int]:
    """Dependents delivered before every dependency of theirs had succeeded, and waiting
    jobs counted down below zero (released twice): both must be 0."""
    with psycopg.connect(url, row_factory=dict_row) as conn:
        row = one_row(conn.execute(schema_statement("dependency_order", schema)))
    return dict(row)


def _worker_pid(worker_id: str | None) -> int | None:
    # Worker ids are host:pid:nonce (pgqueue.claiming.default_worker_id).
    parts = (worker_id or "").split(":")
    if len(parts) >= 2 and parts[-2].isdigit():
        return int(parts[-2])
    return None


def _pids_holding_jobs(queue: Queue) -> set[int]:
    running = queue.list(state="running", limit=1000).jobs
    return {pid for pid in (_worker_pid(job.worker_id) for job in running) if pid is not None}


def run_crash(
    url: str,
    scenario: CrashScenario,
    *,
    log_dir: Path,
    progress: LiveLine | None = None,
    label: str = "crash",
) -> dict[str, Any]:
    """Run one crash scenario in a fresh schema on ``url`` and return its figures."""
    progress = progress or LiveLine()
    rng = random.Random(scenario.seed)
    with database.run_queue(url, "bench_crash") as (schema, queue):
        specs = handlers.recording_jobs(
            scenario.jobs,
            queue=QUEUE_NAME,
            work_ms=scenario.work_ms,
            max_attempts=scenario.max_attempts,
        )
        if scenario.dependencies:
            _enqueue_with_dependencies(queue, specs)
        else:
            observe.enqueue_in_batches(queue, specs)
        started_at = database.database_now(url)
        kills = 0
        kills_holding = 0
        timed_out = False
        with WorkerFleet(url, schema, scenario.worker_settings(), log_dir) as fleet:
            fleet.start(scenario.workers)
            next_kill: float | None = None
            deadline = time.monotonic() + scenario.timeout
            while True:
                fleet.require_running()
                counts = observe.state_counts(queue, QUEUE_NAME)
                done = observe.finished(counts)
                progress.update(
                    f"{label}: {counts['succeeded']}/{scenario.jobs} succeeded, "
                    f"{kills} killed ({kills_holding} holding a job), "
                    f"{len(fleet.running())} workers up"
                )
                if done >= scenario.jobs:
                    break
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                # Kill only once work has begun, so kills land on working processes
                # rather than on interpreters still starting up.
                if next_kill is None and counts["running"] + done > 0:
                    next_kill = time.monotonic()
                killing = scenario.kills is None or kills < scenario.kills
                if killing and next_kill is not None and time.monotonic() >= next_kill:
                    running = fleet.running()
                    holding = _pids_holding_jobs(queue)
                    busy = [p for p in running if p.pid in holding]
                    victim = rng.choice(busy if scenario.victims == "busy" and busy else running)
                    if victim.pid in holding:
                        kills_holding += 1
                    fleet.kill(victim)
                    kills += 1
                    fleet.start_one()
                    # Keep the cadence, but never fire a burst to catch up after a lag.
                    next_kill = max(next_kill + scenario.kill_interval, time.monotonic())
                time.sleep(0.02)
            unexpected_exits = fleet.unexpected_exits()
        progress.clear()
        evidence = observe.evidence(queue, url, schema, log_dir)
        ordering = _dependency_figures(url, schema) if scenario.dependencies else {}
    finished_at = evidence.outcome.last_finished_at
    wall = (finished_at - started_at).total_seconds() if finished_at else None
    return {
        "workers_killed": kills,
        "killed_while_holding_a_job": kills_holding,
        **evidence.figures(),
        "wall_seconds": wall,
        "timed_out": timed_out,
        "workers_started": fleet.started,
        "unexpected_worker_exits": unexpected_exits,
        **ordering,
    }


SUMMARY_FIGURES = (
    "workers_killed",
    "killed_while_holding_a_job",
    "jobs_succeeded",
    "jobs_lost",
    "jobs_never_delivered",
    "duplicate_deliveries",
    "most_deliveries_of_one_job",
    "failed_attempts_recorded",
    "wall_seconds",
)


def summarize_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The spread of each figure over the runs, and whether every run kept every job."""
    return {
        "every_job_succeeded_in_every_run": all(
            run["jobs_lost"] == 0 and not run["timed_out"] for run in runs
        ),
        # Runs with dependencies: no dependent ran early, none was released twice.
        "every_dependency_kept_in_every_run": all(
            run.get("dependents_delivered_early", 0) == 0
            and run.get("dependency_counts_below_zero", 0) == 0
            for run in runs
        ),
        **{name: results.spread(run[name] for run in runs) for name in SUMMARY_FIGURES},
    }


def _describe_run(run: dict[str, Any]) -> str:
    return (
        f"killed {run['workers_killed']} workers ({run['killed_while_holding_a_job']} holding "
        f"a job); {run['jobs_succeeded']}/{run['jobs']} succeeded, {run['jobs_lost']} lost, "
        f"{run['jobs_never_delivered']} never delivered, {run['duplicate_deliveries']} "
        f"duplicate deliveries (at most {run['most_deliveries_of_one_job']} of one job), "
        f"{run['failed_attempts_recorded']} failed attempts recorded, "
        f"{run['wall_seconds'] or 0:.1f} s"
    )


@click.command("crash")
@click.option("--jobs", type=click.IntRange(1), default=1000, show_default=True)
@click.option("--workers", type=click.IntRange(1), default=6, show_default=True)
@click.option(
    "--concurrency", type=click.IntRange(1), default=2, show_default=True, help="Slots per worker."
)
@click.option("--lease-seconds", type=float, default=1.0, show_default=True)
@click.option("--kill-interval", type=float, default=0.3, show_default=True)
@click.option("--kills", type=click.IntRange(0), help="Stop killing after this many kills.")
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option("--seed", type=int, help="Seed for the choice of victims.")
@click.option("--quick", is_flag=True, help="200 jobs, one run.")
@click.option(
    "--dependencies",
    is_flag=True,
    help="Jobs in groups of ten that wait for each other: also check that no dependent "
    "ran before its dependencies succeeded.",
)
@database_url_option
@results_dir_option
def crash_command(
    jobs: int,
    workers: int,
    concurrency: int,
    lease_seconds: float,
    kill_interval: float,
    kills: int | None,
    repeats: int,
    seed: int | None,
    quick: bool,
    dependencies: bool,
    database_url: str | None,
    results_dir: str | None,
) -> None:
    """SIGKILL random workers every 0.3 s while they work; count lost and duplicate jobs."""
    if quick:
        jobs, repeats = min(jobs, 200), 1
    target = database.resolve_target(database_url)
    scenario = CrashScenario(
        jobs=jobs,
        workers=workers,
        concurrency=concurrency,
        lease_seconds=lease_seconds,
        kill_interval=kill_interval,
        kills=kills,
        seed=seed,
        dependencies=dependencies,
    )
    runs = []
    with LiveLine() as progress:
        for repeat in range(repeats):
            with tempfile.TemporaryDirectory(prefix="pgqueue-crash-") as log_dir:
                run = run_crash(
                    target.url,
                    scenario,
                    log_dir=Path(log_dir),
                    progress=progress,
                    label=f"crash run {repeat + 1}/{repeats}",
                )
            runs.append(run)
            progress.log(f"run {repeat + 1}: {_describe_run(run)}")
    summary = summarize_runs(runs)
    parameters = {**asdict(scenario), "repeats": repeats, "kills": kills}
    results.record(
        "crash",
        environment.describe(target.url, target.server),
        parameters=parameters,
        runs=runs,
        summary=summary,
        directory=results_dir,
    )
    if not summary["every_job_succeeded_in_every_run"]:
        raise click.ClickException("some jobs did not succeed: see the runs above")
    if not summary["every_dependency_kept_in_every_run"]:
        raise click.ClickException("a dependent ran before its dependencies: see the runs")
