"""The queue-controls driver: how promptly real ``pgqueue worker`` processes obey a
pause, a resume, a concurrency limit and a rate limit set with
:meth:`pgqueue.Queue.update_queue`.

Every job runs ``bench_record_delivery``, whose delivery row, committed as the handler
starts, stamps that start on the database clock; the jobs table (through
:class:`pgqueue.Queue`) gives each claim and finish. Each part runs on a fresh schema.

- **Pause and resume**: ``workers`` processes (default 2, default poll interval) serve
  a queue of 20 ms jobs, kept from running dry. ``cycles`` times: pause; wait
  ``hold`` seconds; *pause-to-quiet* is the last handler start after the pause minus
  the pause (0 if none started: jobs a worker claimed ahead still start after it);
  resume; *resume-to-first-start* is the first start after the resume minus the
  resume; then let the workers run ``run_seconds`` before the next pause. The moment
  of a pause or resume is the database clock read just before the call (its commit
  falls between that and the read just after; that round trip is reported too), so
  both figures err on the long side by at most that much.
- **Concurrency limit**: 3 with 4 workers on 100 ms jobs; the most jobs running at
  once, sampled every 10 ms from the queue's counts and computed from each job's
  handler start to its finish (a job claimed ahead of a free slot counts as running).
- **Rate limit**: 20 jobs/s with 2 workers; handler starts in the 10 s from the first.

The summary of the runs is :mod:`pgqueue_bench.scenarios.controls.summary`'s.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import click
import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from pgqueue import JobSpec, Queue
from pgqueue_bench import handlers, results
from pgqueue_bench.infra import database, environment
from pgqueue_bench.infra.fleet import WorkerFleet, WorkerSettings
from pgqueue_bench.options import database_url_option, results_dir_option
from pgqueue_bench.progress import LiveLine
from pgqueue_bench.scenarios.controls.summary import most_at_once, summarize
from pgqueue_bench.sql.queries import one_row, statement, statement_in
from pgqueue_bench.verdict import observe

QUEUE_NAME = "bench_controls"
STATEMENTS = "controls.sql"


@dataclass(frozen=True)
class ControlsScenario:
    """One controls run's shape."""

    cycles: int = 20
    workers: int = 2
    # Slots per worker: each handler thread of the recording handler holds a
    # connection of its own, so a few slots keep the server's connections few while
    # 20 ms jobs still start hundreds of times a second.
    concurrency: int = 4
    job_ms: int = 20
    hold: float = 1.5
    run_seconds: float = 0.5
    # Jobs kept queued before every pause, so that a quiet queue means the pause.
    least_queued: int = 1000
    concurrency_limit: int = 3
    concurrency_workers: int = 4
    concurrency_jobs: int = 120
    concurrency_job_ms: int = 100
    rate_limit: float = 20.0
    rate_workers: int = 2
    rate_window: float = 10.0
    timeout: float = 60.0

    def worker_settings(self) -> WorkerSettings:
        """The worker's defaults (its 1 s poll interval included) but the slots, and
        only warnings logged: a log line per job is not what is measured."""
        return WorkerSettings(
            queue=QUEUE_NAME,
            concurrency=self.concurrency,
            shutdown_timeout=10,
            extra_args=("--log-level", "warning"),
        )


@dataclass(frozen=True)
class Starts:
    """Handler starts in a window of the database clock."""

    count: int
    first: datetime | None  # None (as last) when the window holds no start
    last: datetime | None

    def first_start(self) -> datetime:
        """``first``, of a window that holds a start: the caller waited for one, and a
        window open at its end only gains starts (delivery rows are never deleted)."""
        if self.first is None:
            raise RuntimeError("no handler start in a window that was seen to hold one")
        return self.first


class StartLog:
    """The handler starts of a run's schema, and the database clock, read on one
    autocommit connection of the driver's own."""

    def __init__(self, url: str, schema: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
        self.query = statement_in(STATEMENTS, "starts_between", schema=sql.Identifier(schema))

    def now(self) -> datetime:
        """The database clock (an autocommit statement's now() is its own start)."""
        now: datetime = one_row(self.conn.execute(statement("database_now")))[0]
        return now

    def between(self, after: datetime | None = None, before: datetime | None = None) -> Starts:
        """The starts from ``after`` on and before ``before`` (None: unbounded)."""
        cur = self.conn.cursor(row_factory=dict_row)
        row = one_row(cur.execute(self.query, {"after": after, "before": before}))
        return Starts(int(row["starts"]), row["first"], row["last"])

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


def _ms(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds() * 1000


def _jobs(count: int, job_ms: int) -> list[JobSpec]:
    return handlers.recording_jobs(
        count, queue=QUEUE_NAME, work_ms=(job_ms, job_ms), max_attempts=3
    )


def _keep_queued(queue: Queue, scenario: ControlsScenario) -> int:
    """Top the queue up to twice ``least_queued`` when it fell below it; the jobs
    queued now."""
    queued = observe.state_counts(queue, QUEUE_NAME)["queued"]
    if queued < scenario.least_queued:
        more = 2 * scenario.least_queued - queued
        observe.enqueue_in_batches(queue, _jobs(more, scenario.job_ms))
        queued += more
    return queued


def pause_cycle(queue: Queue, starts: StartLog, scenario: ControlsScenario) -> dict[str, Any]:
    """One pause, hold, resume; the figures of both transitions."""
    queued = _keep_queued(queue, scenario)
    paused_at = starts.now()
    queue.pause_queue(QUEUE_NAME)
    pause_returned = starts.now()
    time.sleep(scenario.hold)
    late = starts.between(after=paused_at)
    resumed_at = starts.now()
    queue.resume_queue(QUEUE_NAME)
    resume_returned = starts.now()
    observe.wait_for(
        lambda: starts.between(after=resumed_at).count > 0,
        scenario.timeout,
        interval=0.01,
        what="a start after the resume",
    )
    first = starts.between(after=resumed_at).first_start()
    time.sleep(scenario.run_seconds)
    return {
        "scenario": "pause_resume",
        "queued_at_pause": queued,
        "pause_command_ms": _ms(pause_returned, paused_at),
        "starts_after_pause": late.count,
        # last is None exactly when count is 0: both come from one aggregate.
        "pause_to_quiet_ms": _ms(late.last, paused_at) if late.last is not None else 0.0,
        "resume_command_ms": _ms(resume_returned, resumed_at),
        "resume_to_first_start_ms": _ms(first, resumed_at),
    }


def run_pause_resume(
    url: str, scenario: ControlsScenario, *, log_dir: Path, progress: LiveLine
) -> list[dict[str, Any]]:
    """The pause and resume cycles on a fresh schema."""
    with database.run_queue(url, "bench_controls") as (schema, queue):
        _keep_queued(queue, scenario)
        starts = StartLog(url, schema)
        try:
            with WorkerFleet(url, schema, scenario.worker_settings(), log_dir) as fleet:
                fleet.start(scenario.workers)
                progress.update(f"pause/resume: starting {scenario.workers} workers", force=True)

                def working() -> bool:
                    fleet.require_running()
                    return starts.between().count > 20

                observe.wait_for(working, scenario.timeout, what="the workers to start jobs")
                time.sleep(scenario.run_seconds)
                cycles = []
                for cycle in range(scenario.cycles):
                    fleet.require_running()
                    progress.update(f"pause/resume: cycle {cycle + 1}/{scenario.cycles}")
                    cycles.append({"cycle": cycle + 1, **pause_cycle(queue, starts, scenario)})
                    progress.log(_describe_cycle(cycles[-1]))
        finally:
            starts.close()
    return cycles


def run_concurrency_limit(
    url: str, scenario: ControlsScenario, *, log_dir: Path, progress: LiveLine
) -> dict[str, Any]:
    """Jobs of a queue limited to ``concurrency_limit`` at once, served by
    ``concurrency_workers`` workers: the most running at once."""
    total = scenario.concurrency_jobs
    with database.run_queue(url, "bench_controls") as (schema, queue):
        observe.enqueue_in_batches(queue, _jobs(total, scenario.concurrency_job_ms))
        queue.update_queue(QUEUE_NAME, concurrency_limit=scenario.concurrency_limit)
        samples = []
        with WorkerFleet(url, schema, scenario.worker_settings(), log_dir) as fleet:
            fleet.start(scenario.concurrency_workers)
            deadline = (
                time.monotonic() + scenario.timeout + total * scenario.concurrency_job_ms / 1000
            )
            while True:
                fleet.require_running()
                counts = observe.state_counts(queue, QUEUE_NAME)
                samples.append(counts["running"])
                progress.update(f"concurrency limit: {counts['succeeded']}/{total} succeeded")
                if observe.finished(counts) >= total:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("the concurrency-limited jobs did not finish")
                time.sleep(0.01)
        jobs = [job for job in observe.all_jobs(queue) if job.started_at is not None]
        with psycopg.connect(url) as conn:
            first_starts: dict[int, datetime] = dict(
                conn.execute(
                    statement_in(STATEMENTS, "first_starts", schema=sql.Identifier(schema))
                ).fetchall()
            )
    first = min(job.started_at for job in jobs if job.started_at is not None)
    last = max(job.finished_at for job in jobs if job.finished_at is not None)
    seconds = (last - first).total_seconds()
    return {
        "scenario": "concurrency_limit",
        "limit": scenario.concurrency_limit,
        "workers": scenario.concurrency_workers,
        "slots_per_worker": scenario.concurrency,
        "jobs": total,
        "job_ms": scenario.concurrency_job_ms,
        "samples": len(samples),
        "most_running_sampled": max(samples),
        # From each handler's start to its job's finish: both within the time the job
        # counts against the limit (from the claim's commit to the ack's), so these
        # overlap no more than the limit allows. Not from started_at, the claim
        # transaction's start, which comes before that claim waited for its turn on the
        # queue's row, and so before the ack that made room for it.
        "most_running_from_jobs": most_at_once(
            (first_starts[j.id], j.finished_at) for j in jobs if j.id in first_starts
        ),
        "seconds": seconds,
        "jobs_per_second": total / seconds if seconds else None,
        # At the limit, jobs of job_ms each finish at most this often.
        "jobs_per_second_at_the_limit": scenario.concurrency_limit
        * 1000
        / scenario.concurrency_job_ms,
    }


def run_rate_limit(
    url: str, scenario: ControlsScenario, *, log_dir: Path, progress: LiveLine
) -> dict[str, Any]:
    """Jobs of a queue limited to ``rate_limit`` per second, served by
    ``rate_workers`` workers: the starts in ``rate_window`` seconds from the first."""
    # Twice what the window should start, so the queue never runs dry within it.
    total = int(2 * scenario.rate_limit * scenario.rate_window) + 10
    with database.run_queue(url, "bench_controls") as (schema, queue):
        observe.enqueue_in_batches(queue, _jobs(total, 1))
        queue.update_queue(QUEUE_NAME, rate_limit=scenario.rate_limit)
        starts = StartLog(url, schema)
        try:
            with WorkerFleet(url, schema, scenario.worker_settings(), log_dir) as fleet:
                fleet.start(scenario.rate_workers)
                progress.update(f"rate limit: starting {scenario.rate_workers} workers", force=True)

                def started() -> bool:
                    fleet.require_running()
                    return starts.between().count > 0

                observe.wait_for(started, scenario.timeout, what="the first start")
                first = starts.between().first_start()
                end = first + timedelta(seconds=scenario.rate_window)

                def window_over() -> bool:
                    fleet.require_running()
                    progress.update(f"rate limit: {starts.between(before=end).count} started")
                    return starts.now() > end + timedelta(seconds=0.5)

                observe.wait_for(
                    window_over, scenario.rate_window + scenario.timeout, what="the window"
                )
                counted = starts.between(after=first, before=end).count
        finally:
            starts.close()
    expected = scenario.rate_limit * scenario.rate_window
    return {
        "scenario": "rate_limit",
        "rate_limit": scenario.rate_limit,
        "workers": scenario.rate_workers,
        "window_seconds": scenario.rate_window,
        "starts": counted,
        "expected_starts": expected,
        "starts_per_second": counted / scenario.rate_window,
        "ratio_to_limit": counted / expected,
    }


def _describe_cycle(cycle: dict[str, Any]) -> str:
    return (
        f"cycle {cycle['cycle']}: quiet {cycle['pause_to_quiet_ms']:.1f} ms after the pause "
        f"({cycle['starts_after_pause']} starts after it), first start "
        f"{cycle['resume_to_first_start_ms']:.1f} ms after the resume"
    )


@click.command("controls")
@click.option(
    "--cycles", type=click.IntRange(1), default=20, show_default=True, help="Pause/resume cycles."
)
@click.option(
    "--workers", type=click.IntRange(1), default=2, show_default=True, help="Worker processes."
)
@click.option(
    "--concurrency", type=click.IntRange(1), default=4, show_default=True, help="Slots per worker."
)
@click.option("--quick", is_flag=True, help="3 cycles, 30 limited jobs, a 3 s rate window.")
@database_url_option
@results_dir_option
def controls_command(
    cycles: int,
    workers: int,
    concurrency: int,
    quick: bool,
    database_url: str | None,
    results_dir: str | None,
) -> None:
    """Pause-to-quiet and resume-to-first-start with real workers; a concurrency limit
    and a rate limit held across workers."""
    scenario = ControlsScenario(cycles=cycles, workers=workers, concurrency=concurrency)
    if quick:
        scenario = ControlsScenario(
            cycles=min(cycles, 3),
            workers=workers,
            concurrency=concurrency,
            concurrency_jobs=30,
            rate_window=3.0,
        )
    target = database.resolve_target(database_url)
    runs: list[dict[str, Any]] = []
    with LiveLine() as progress:
        for part in (run_pause_resume, run_concurrency_limit, run_rate_limit):
            with tempfile.TemporaryDirectory(prefix="pgqueue-controls-") as log_dir:
                outcome = part(target.url, scenario, log_dir=Path(log_dir), progress=progress)
            runs += outcome if isinstance(outcome, list) else [outcome]
        progress.clear()
    summary = summarize(runs)
    parameters = {**asdict(scenario), "worker": scenario.worker_settings().arguments()}
    results.record(
        "controls",
        environment.describe(target.url, target.server),
        parameters=parameters,
        runs=runs,
        summary=summary,
        directory=results_dir,
    )
    for name in ("pause_to_quiet_ms", "resume_to_first_start_ms"):
        figure = summary[name]
        click.echo(
            f"{name}: median {figure['median']:.1f}, min {figure['min']:.1f}, "
            f"max {figure['max']:.1f} over {figure['runs']} cycles"
        )
    click.echo(f"concurrency limit: {summary['concurrency_limit']}")
    click.echo(f"rate limit: {summary['rate_limit']}")
