"""The restart driver: restart PostgreSQL under a working fleet, and prove that no
job was lost and every job succeeded.

By default each run gets a private cluster (:class:`~pgqueue_bench.infra.servers.PrivateServer`)
that is restarted with ``pg_ctl restart -m fast`` (open transactions roll back, then a
clean shutdown) or ``-m immediate`` (no shutdown checkpoint: the next start runs crash
recovery). ``--restart-cmd`` restarts any other server instead, with a shell command.

The restart happens once ``restart_at`` of the jobs have succeeded. The driver then
measures, on the database clock, how long the server took to accept connections
again and how long until every job had succeeded.
"""

from __future__ import annotations

import logging
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import psycopg
from psycopg.rows import dict_row

from pgqueue import DatabaseUnavailable
from pgqueue_bench import handlers, results
from pgqueue_bench.infra import database, environment
from pgqueue_bench.infra.binaries import binaries_for
from pgqueue_bench.infra.fleet import WorkerFleet, WorkerSettings
from pgqueue_bench.infra.servers import PrivateServer, ShutdownMode
from pgqueue_bench.options import results_dir_option
from pgqueue_bench.progress import LiveLine
from pgqueue_bench.sql.queries import one_row, statement
from pgqueue_bench.verdict import observe

QUEUE_NAME = "bench_restart"
RESTART_MODES: tuple[ShutdownMode, ...] = ("fast", "immediate")
# The evidence figures (observe.Evidence.figures) a run reports after
# "jobs_succeeded_before_restart", in the order of the restart results files.
REPORTED_FIGURES = (
    "jobs_succeeded",
    "jobs_lost",
    "handler_invocations",
    "delivery_rows",
    "jobs_never_delivered",
    "duplicate_deliveries",
    "failed_attempts_recorded",
)


@dataclass(frozen=True)
class RestartScenario:
    """One restart run's shape."""

    jobs: int = 500
    workers: int = 4
    concurrency: int = 2
    lease_seconds: float = 5.0
    restart_at: float = 0.3
    work_ms: tuple[int, int] = handlers.DEFAULT_WORK_MS
    # A job whose handler or ack met the restart fails an attempt or two; it must
    # never run out of attempts for that.
    max_attempts: int = 25
    timeout: float = 300.0

    def worker_settings(self) -> WorkerSettings:
        """The worker's defaults, except a faster reaper and retry backoff, so the
        run ends soon after the server is back."""
        return WorkerSettings(
            queue=QUEUE_NAME,
            concurrency=self.concurrency,
            lease_seconds=self.lease_seconds,
            reap_interval=1.0,
            poll_interval=0.5,
            retry_base=0.2,
            retry_cap=2.0,
            shutdown_timeout=10,
        )


def _started_at_and_now(url: str) -> tuple[datetime, datetime] | None:
    """(postmaster start time, now) if a connection succeeds right now."""
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            cur = conn.cursor(row_factory=dict_row)
            cur.execute(statement("server_started_at"))
            row = one_row(cur)
            return row["started_at"], row["now"]
    except psycopg.Error:
        return None


def restart_and_time(
    url: str, restart: Callable[[], object], timeout: float = 120
) -> dict[str, Any]:
    """Run ``restart`` in the background and wait for a new postmaster to accept a
    connection. Returns the restart's start on the database clock and the seconds
    until the new server accepted a connection (database clock on both ends)."""
    before = _started_at_and_now(url)
    if before is None:
        raise RuntimeError("the server is not accepting connections before the restart")
    old_start, issued_at = before
    failure: list[BaseException] = []

    def run() -> None:
        try:
            restart()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, name="restart", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while True:
        now = _started_at_and_now(url)
        if now is not None and now[0] > old_start:
            accepted_at = now[1]
            break
        if failure:
            raise failure[0]
        if time.monotonic() > deadline:
            raise TimeoutError(f"server not back after {timeout:.0f} s")
        time.sleep(0.01)
    thread.join(timeout)
    if failure:
        raise failure[0]
    return {
        "restart_issued_at": issued_at,
        "seconds_to_accept_connections": (accepted_at - issued_at).total_seconds(),
    }


def run_restart(
    url: str,
    scenario: RestartScenario,
    restart: Callable[[], object],
    *,
    log_dir: Path,
    progress: LiveLine | None = None,
    label: str = "restart",
) -> dict[str, Any]:
    """Run one restart scenario in a fresh schema on ``url``; ``restart`` restarts
    the server and may return before it accepts connections again."""
    progress = progress or LiveLine()
    # The driver's own pool loses its connections with the server, as expected here.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    with database.run_queue(url, "bench_restart") as (schema, queue):
        specs = handlers.recording_jobs(
            scenario.jobs,
            queue=QUEUE_NAME,
            work_ms=scenario.work_ms,
            max_attempts=scenario.max_attempts,
        )
        observe.enqueue_in_batches(queue, specs)
        restart_after = max(1, round(scenario.jobs * scenario.restart_at))
        with WorkerFleet(url, schema, scenario.worker_settings(), log_dir) as fleet:
            fleet.start(scenario.workers)

            at_restart: dict[str, int] = {}

            def succeeded_enough() -> bool:
                fleet.require_running()
                counts = observe.state_counts(queue, QUEUE_NAME)
                at_restart.update(counts)
                progress.update(
                    f"{label}: {counts['succeeded']}/{scenario.jobs} succeeded, "
                    f"restart at {restart_after}"
                )
                return counts["succeeded"] >= restart_after

            observe.wait_for(succeeded_enough, scenario.timeout, what="jobs before the restart")
            progress.update(f"{label}: restarting the server", force=True)
            timing = restart_and_time(url, restart)
            # The pool's connections died with the old server; the pool replaces them.
            deadline = time.monotonic() + scenario.timeout
            timed_out = False
            while True:
                fleet.require_running()
                try:
                    counts = observe.state_counts(queue, QUEUE_NAME)
                except DatabaseUnavailable:  # the pool may still be reconnecting
                    counts = None
                if counts is not None:
                    progress.update(
                        f"{label}: {counts['succeeded']}/{scenario.jobs} succeeded after the restart"
                    )
                    if observe.finished(counts) >= scenario.jobs:
                        break
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                time.sleep(0.05)
            unexpected_exits = fleet.unexpected_exits()
        progress.clear()
        evidence = observe.evidence(queue, url, schema, log_dir)
    final, figures = evidence.outcome, evidence.figures()
    issued_at = timing["restart_issued_at"]
    return {
        "seconds_to_accept_connections": timing["seconds_to_accept_connections"],
        "seconds_to_all_succeeded": (
            (final.last_finished_at - issued_at).total_seconds()
            if final.last_finished_at and not timed_out and final.lost == 0
            else None
        ),
        "jobs": final.jobs,
        "jobs_succeeded_before_restart": at_restart["succeeded"],
        **{name: figures[name] for name in REPORTED_FIGURES},
        "timed_out": timed_out,
        "unexpected_worker_exits": unexpected_exits,
    }


def run_on_private_server(
    scenario: RestartScenario,
    mode: ShutdownMode,
    *,
    log_dir: Path,
    progress: LiveLine | None = None,
    label: str = "restart",
    like_url: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run one scenario on a private cluster restarted with ``pg_ctl restart -m mode``.
    Returns the run's figures and the cluster's environment block."""
    with PrivateServer(binaries_for(like_url)) as server:
        url = server.url()
        server_env = environment.postgresql(url, f"private cluster, {server.binaries.label}")
        run = run_restart(
            url,
            scenario,
            lambda: server.restart(mode),
            log_dir=log_dir,
            progress=progress,
            label=label,
        )
    return {"mode": mode, **run}, server_env


SUMMARY_FIGURES = (
    "seconds_to_accept_connections",
    "seconds_to_all_succeeded",
    "jobs_lost",
    "handler_invocations",
    "delivery_rows",
    "duplicate_deliveries",
    "failed_attempts_recorded",
)


def summarize_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per restart mode, the spread of each figure, and whether every job of every run
    succeeded."""
    by_mode: dict[str, Any] = {}
    for mode in dict.fromkeys(run["mode"] for run in runs):
        chosen = [run for run in runs if run["mode"] == mode]
        by_mode[mode] = {
            name: results.spread(run[name] for run in chosen) for name in SUMMARY_FIGURES
        }
    return {
        "every_job_succeeded_in_every_run": all(
            run["jobs_lost"] == 0 and not run["timed_out"] for run in runs
        ),
        "by_mode": by_mode,
    }


def _how(mode: str) -> str:
    """How the server was restarted, for people: ``pg_ctl restart -m fast`` or the command."""
    return f"pg_ctl restart -m {mode}" if mode in RESTART_MODES else "--restart-cmd"


def _describe_run(run: dict[str, Any]) -> str:
    all_done = run["seconds_to_all_succeeded"]
    return (
        f"{_how(run['mode'])}: accepting again after "
        f"{run['seconds_to_accept_connections']:.2f} s, all succeeded after "
        f"{'-' if all_done is None else f'{all_done:.1f}'} s; "
        f"{run['jobs_succeeded']}/{run['jobs']} succeeded, {run['jobs_lost']} lost, "
        f"{run['handler_invocations']} handler invocations, {run['delivery_rows']} delivery "
        f"rows, {run['failed_attempts_recorded']} failed attempts"
    )


@click.command("restart")
@click.option("--jobs", type=click.IntRange(1), default=500, show_default=True)
@click.option("--workers", type=click.IntRange(1), default=4, show_default=True)
@click.option(
    "--concurrency", type=click.IntRange(1), default=2, show_default=True, help="Slots per worker."
)
@click.option("--lease-seconds", type=float, default=5.0, show_default=True)
@click.option(
    "--restart-at",
    type=click.FloatRange(0, 1, max_open=True),
    default=0.3,
    show_default=True,
    help="Restart once this fraction of the jobs succeeded.",
)
@click.option(
    "--mode",
    "modes",
    type=click.Choice(RESTART_MODES),
    multiple=True,
    help="pg_ctl shutdown mode of the private cluster (repeatable). Default: fast, then immediate.",
)
@click.option(
    "--restart-cmd",
    help="Shell command that restarts the server at --database-url/DATABASE_URL, "
    "instead of a private cluster.",
)
@click.option("--repeats", type=click.IntRange(1), default=1, show_default=True)
@click.option("--quick", is_flag=True, help="200 jobs.")
@click.option("--database-url", envvar="DATABASE_URL", help="Only with --restart-cmd.")
@results_dir_option
def restart_command(
    jobs: int,
    workers: int,
    concurrency: int,
    lease_seconds: float,
    restart_at: float,
    modes: tuple[str, ...],
    restart_cmd: str | None,
    repeats: int,
    quick: bool,
    database_url: str | None,
    results_dir: str | None,
) -> None:
    """Restart PostgreSQL (fast, then immediate) while workers run; count lost jobs."""
    if quick:
        jobs = min(jobs, 200)
    scenario = RestartScenario(
        jobs=jobs,
        workers=workers,
        concurrency=concurrency,
        lease_seconds=lease_seconds,
        restart_at=restart_at,
    )
    runs: list[dict[str, Any]] = []
    with LiveLine() as progress:
        if restart_cmd:
            target = database.resolve_target(database_url)
            server_env = environment.postgresql(target.url, target.server)
            for repeat in range(repeats):
                with tempfile.TemporaryDirectory(prefix="pgqueue-restart-") as log_dir:
                    run = run_restart(
                        target.url,
                        scenario,
                        lambda: subprocess.run(restart_cmd, shell=True, check=True),
                        log_dir=Path(log_dir),
                        progress=progress,
                        label=f"restart run {repeat + 1}/{repeats}",
                    )
                run = {"mode": "restart-cmd", **run}
                runs.append(run)
                progress.log(f"run {repeat + 1}: {_describe_run(run)}")
        else:
            for repeat in range(repeats):
                for mode in modes or RESTART_MODES:
                    with tempfile.TemporaryDirectory(prefix="pgqueue-restart-") as log_dir:
                        run, server_env = run_on_private_server(
                            scenario,
                            mode,  # type: ignore[arg-type]
                            log_dir=Path(log_dir),
                            progress=progress,
                            label=f"restart -m {mode}, run {repeat + 1}/{repeats}",
                            like_url=database_url,
                        )
                    runs.append(run)
                    progress.log(_describe_run(run))
    block = environment.describe_with(server_env)
    parameters = {
        **asdict(scenario),
        "repeats": repeats,
        "restart": "--restart-cmd" if restart_cmd else "pg_ctl restart on a private cluster",
    }
    summary = summarize_runs(runs)
    results.record(
        "restart",
        block,
        parameters=parameters,
        runs=runs,
        summary=summary,
        directory=results_dir,
    )
    if not summary["every_job_succeeded_in_every_run"]:
        raise click.ClickException("some jobs did not succeed: see the runs above")
