"""``pgqueue bench effects``: side effects in the application's own tables, exactly once
when the handler completes its job in the same transaction, under chaos.

A private cluster (it is crashed on purpose) runs one schema with the audit trail
installed and an application table with no unique constraint (``effects_rows``). Two
handlers (:mod:`~pgqueue_bench.scenarios.effects.tasks`) get ``--jobs`` jobs each, interleaved
on one queue, served by ``--workers`` real ``pgqueue worker`` processes with a short
lease:

- the fenced handler writes its row and completes the job in one transaction, fenced
  by the attempt's lease (half of its jobs with ``job.transaction()``, half on a
  connection of its own with ``job.complete(conn)``);
- the plain handler writes its row, then returns, and the worker acks afterwards.

While they work, the chaos loop (:class:`~pgqueue_bench.scenarios.soak.chaos.Chaos`) injects,
after every quiet spell of ``--fault-every`` seconds, the next of rounds of four
faults in a random order: a worker SIGKILLed (and replaced), a worker SIGSTOPped past
its lease (its jobs are reaped and run again elsewhere) then SIGCONTed, every worker
and handler connection ended with ``pg_terminate_backend``, and PostgreSQL stopped
with ``pg_ctl stop -m immediate`` and started again (crash recovery). Once every job
has finished the chaos stops, the workers stop, and the run counts, per handler, the
jobs without a row (missing) and the rows beyond the first of each job (duplicated).

At-least-once delivery runs some jobs more than once: the plain handler's rows show
it. The fenced handler's must not: 0 missing, 0 duplicated. The command exits 1 when
a job did not succeed, the fenced handler's rows are not exactly one per job, the
audit trail holds a job completed twice, or a fault failed to inject.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import psycopg

from pgqueue import DatabaseUnavailable, Job, JobSpec, JobState, Queue
from pgqueue_bench import results
from pgqueue_bench.infra import database, environment
from pgqueue_bench.infra.binaries import binaries_for
from pgqueue_bench.infra.fleet import WorkerFleet, WorkerSettings
from pgqueue_bench.infra.servers import PrivateServer, quiet_pool_logs
from pgqueue_bench.options import results_dir_option, seconds_range
from pgqueue_bench.progress import LiveLine
from pgqueue_bench.scenarios.effects.tasks import (
    APPLICATION_NAME,
    FENCED_TASK,
    FENCED_WAYS,
    LEASE_LOST_LOG,
    PLAIN_TASK,
    QUEUE,
    RUN_DIR_VARIABLE,
    SQL_FILE,
    TASKS,
)
from pgqueue_bench.scenarios.soak.chaos import WORKER_APPLICATIONS, Chaos
from pgqueue_bench.sql.queries import schema_statement_in
from pgqueue_bench.verdict import audit, deliveries, observe

FAULT_KINDS = ("worker_sigkill", "worker_sigstop", "terminate_backends", "server_crash")
HANDLERS = {"fenced": FENCED_TASK, "plain": PLAIN_TASK}
"""The handlers by their names in the results, and their tasks."""


@dataclass(frozen=True)
class EffectsScenario:
    """One effects run's shape; recorded in the results' parameters."""

    jobs: int = 2000
    """Per handler."""
    workers: int = 4
    concurrency: int = 4
    lease_seconds: float = 2.0
    work_ms: tuple[float, float] = (100.0, 400.0)
    fault_every: tuple[float, float] = (1.0, 3.0)
    # Generous, so that a job unlucky enough to meet many faults is retried rather
    # than dead-lettered: this run is about side effects, not about retry policy.
    max_attempts: int = 25
    timeout: float = 1800.0
    seed: int = 1

    def worker_settings(self) -> WorkerSettings:
        """Short lease and reap intervals, so that the jobs of a killed or frozen
        worker are run again within seconds, while it may still be writing."""
        return WorkerSettings(
            queue=QUEUE,
            concurrency=self.concurrency,
            lease_seconds=self.lease_seconds,
            heartbeat_seconds=round(self.lease_seconds / 3, 3),
            reap_interval=round(self.lease_seconds / 2, 3),
            poll_interval=0.2,
            retry_base=0.1,
            retry_cap=1.0,
            shutdown_timeout=10,
            extra_args=(
                "--plugin",
                "pgqueue_bench.scenarios.effects.tasks",
                "--no-plugin-autoload",
            ),
        )

    def job_specs(self) -> list[JobSpec]:
        """The jobs of both handlers, interleaved, so that every fault meets both;
        the fenced handler's alternate between its two ways of completing."""
        specs = []
        for seq in range(self.jobs):
            work = {"seq": seq, "work_ms": list(self.work_ms)}
            via = FENCED_WAYS[seq % len(FENCED_WAYS)]
            for task, payload in ((FENCED_TASK, {**work, "via": via}), (PLAIN_TASK, work)):
                specs.append(JobSpec(task, payload, queue=QUEUE, max_attempts=self.max_attempts))
        return specs


def _counts(queue: Queue) -> dict[str, int] | None:
    """The queue's state counts, or None while the database cannot answer (the driver's
    pool reconnects after a crash or a terminated backend)."""
    try:
        return observe.state_counts(queue, QUEUE)
    except DatabaseUnavailable:
        return None


def _chaos_until_finished(
    queue: Queue,
    fleet: WorkerFleet,
    chaos: Chaos,
    scenario: EffectsScenario,
    rng: random.Random,
    progress: LiveLine,
) -> bool:
    """Inject faults until every job has finished; True if the run timed out first."""
    total = scenario.jobs * len(TASKS)
    deadline = time.monotonic() + scenario.timeout
    round_left: list[str] = []
    next_fault = time.monotonic() + rng.uniform(*scenario.fault_every)
    while True:
        fleet.require_running()
        counts = _counts(queue)
        if counts is not None:
            progress.update(
                f"effects: {counts['succeeded']}/{total} succeeded, "
                f"{len(chaos.faults)} faults, {len(fleet.running())} workers up"
            )
            if observe.finished(counts) >= total:
                return False
        if time.monotonic() > deadline:
            return True
        if time.monotonic() >= next_fault:
            # Rounds of every kind in a random order: each kind as often as the others.
            if not round_left:
                round_left = list(chaos.kinds)
                rng.shuffle(round_left)
            fault = chaos.inject(round_left.pop())
            progress.log(
                f"{fault['start_elapsed_seconds']:7.1f} s  {fault['kind']} for "
                f"{fault['seconds']:.1f} s {fault['details'] or ''}{fault['error'] or ''}"
            )
            next_fault = time.monotonic() + rng.uniform(*scenario.fault_every)
        time.sleep(0.1)


def _rows_per_job(url: str, schema: str) -> dict[int, int]:
    """How many rows of the application table each job has (none: not there)."""
    with psycopg.connect(url, connect_timeout=10) as conn:
        rows = conn.execute(schema_statement_in(SQL_FILE, "effects_rows_per_job", schema))
        return {job_id: int(count) for job_id, _, count in rows.fetchall()}


def handler_figures(
    jobs: list[Job],
    rows_of: dict[int, int],
    runs: list[tuple[int, int, str, int]],
    refused: list[tuple[int, int, str, int]],
) -> dict[str, int]:
    """What one handler's ``jobs`` left: ``missing`` counts the jobs without a row,
    ``duplicated`` the rows beyond the first of each job. ``runs`` and ``refused`` are
    the handler runs and the fence's refusals (LeaseLost) logged, of any jobs."""
    ids = {job.id for job in jobs}
    final = observe.outcome(jobs)
    rows = [rows_of.get(job.id, 0) for job in jobs]
    return {
        "jobs": final.jobs,
        "jobs_succeeded": final.succeeded,
        "handler_runs": sum(1 for run in runs if run[0] in ids),
        "rows": sum(rows),
        "missing": sum(1 for count in rows if count == 0),
        "duplicated": sum(count - 1 for count in rows if count > 1),
        "jobs_duplicated": sum(1 for count in rows if count > 1),
        "most_rows_of_one_job": max(rows, default=0),
        "rows_of_jobs_not_succeeded": sum(
            rows_of.get(job.id, 0) for job in jobs if job.state is not JobState.SUCCEEDED
        ),
        "completions_refused": sum(1 for run in refused if run[0] in ids),
        "failed_attempts_recorded": final.failed_attempts,
        "jobs_with_expired_lease": final.jobs_with_expired_lease,
    }


def _evidence(
    url: str,
    schema: str,
    queue: Queue,
    run_dir: Path,
    fleet: WorkerFleet,
    acknowledged: dict[str, int],
) -> dict[str, Any]:
    """Per handler, what the jobs table, the application table and the handlers' logs
    say; and, from the audit trail, whether a job was completed twice."""
    jobs = observe.all_jobs(queue)
    rows_of = _rows_per_job(url, schema)
    refused = deliveries.read_invocations(run_dir / LEASE_LOST_LOG)
    figures: dict[str, Any] = {}
    for name, task in HANDLERS.items():
        mine = [job for job in jobs if job.task == task]
        runs = deliveries.read_invocations(run_dir / task)
        figures[name] = handler_figures(mine, rows_of, runs, refused)
        if task == FENCED_TASK:
            figures[name]["by_way"] = {
                way: handler_figures(
                    [job for job in mine if job.payload.get("via") == way], rows_of, runs, refused
                )
                for way in FENCED_WAYS
            }
    judged = audit.judge(
        acknowledged,
        {job.id: job.state.value for job in jobs},
        audit.transitions(url, schema),
        deliveries.worker_acks(list(fleet.log_paths.values())),
    )
    finished_at = observe.outcome(jobs).last_finished_at
    return {
        "handlers": figures,
        "lost": len(judged.lost),
        "completed_twice": judged.completed_twice,
        "acks_committed": judged.acks_written,
        "unacknowledged_jobs": len(judged.unacknowledged),
        "last_finished_at": finished_at,
    }


def run_effects(
    scenario: EffectsScenario,
    *,
    run_dir: Path,
    like_url: str | None = None,
    progress: LiveLine | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run one effects scenario on a private cluster of the PostgreSQL version
    ``like_url`` runs (default: the embedded one). Returns the run's figures and the
    cluster's environment block."""
    progress = progress or LiveLine()
    quiet_pool_logs()
    rng = random.Random(scenario.seed)
    with (
        PrivateServer(binaries_for(like_url)) as server,
        database.run_queue(server.url(), "bench_effects") as (schema, queue),
    ):
        url = server.url()
        server_env = environment.postgresql(url, f"private cluster, {server.binaries.label}")
        audit.install(url, schema)
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(schema_statement_in(SQL_FILE, "effects_table_create", schema))
        specs = scenario.job_specs()
        ids = observe.enqueue_in_batches(queue, specs)
        acknowledged = {
            f"{spec.task}:{spec.payload['seq']}": job_id
            for spec, job_id in zip(specs, ids, strict=True)
        }
        fleet = WorkerFleet(
            url,
            schema,
            scenario.worker_settings(),
            run_dir / "workers",
            environment={RUN_DIR_VARIABLE: str(run_dir)},
        )
        with fleet:
            fleet.start(scenario.workers)
            fleet.wait_serving()
            started_at = database.database_now(url)
            chaos = Chaos(
                server,
                fleet,
                lease_seconds=scenario.lease_seconds,
                rng=rng,
                started=time.monotonic(),
                kinds=FAULT_KINDS,
                applications=(*WORKER_APPLICATIONS, APPLICATION_NAME),
            )
            timed_out = _chaos_until_finished(queue, fleet, chaos, scenario, rng, progress)
            unexpected_exits = fleet.unexpected_exits()
        progress.clear()
        # A queue of its own: the driver's pool may still hold a connection that the
        # last fault broke.
        with Queue.connect(url, schema=schema, max_size=1) as reader:
            evidence = _evidence(url, schema, reader, run_dir, fleet, acknowledged)
    finished_at = evidence.pop("last_finished_at")
    faults = chaos.faults
    return {
        **evidence,
        "faults_injected": dict(Counter(fault["kind"] for fault in faults)),
        "faults_failed": [f"{f['kind']}: {f['error']}" for f in faults if f["error"]],
        "faults": faults,
        "wall_seconds": (finished_at - started_at).total_seconds() if finished_at else None,
        "timed_out": timed_out,
        "workers_started": fleet.started,
        "unexpected_worker_exits": unexpected_exits,
    }, server_env


def verdict(run: dict[str, Any]) -> dict[str, Any]:
    """What the run shows: every job succeeded; the fenced handler's rows exactly one per
    job; the plain handler's none missing (its duplicates are at-least-once's); no job
    completed twice; every fault kind injected, none failing to."""
    fenced, plain = run["handlers"]["fenced"], run["handlers"]["plain"]
    every_job_succeeded = not run["timed_out"] and all(
        figures["jobs_succeeded"] == figures["jobs"] for figures in (fenced, plain)
    )
    fenced_exactly_once = (
        fenced["missing"] == 0
        and fenced["duplicated"] == 0
        and fenced["rows"] == fenced["jobs_succeeded"]
    )
    faults_injected = set(run["faults_injected"]) >= set(FAULT_KINDS) and not run["faults_failed"]
    passed = (
        every_job_succeeded
        and fenced_exactly_once
        and plain["missing"] == 0
        and run["lost"] == 0
        and run["completed_twice"] == 0
        and faults_injected
        and not run["unexpected_worker_exits"]
    )
    return {
        "passed": passed,
        "every_job_succeeded": every_job_succeeded,
        "fenced_exactly_once": fenced_exactly_once,
        "fenced_missing": fenced["missing"],
        "fenced_duplicated": fenced["duplicated"],
        "plain_missing": plain["missing"],
        "plain_duplicated": plain["duplicated"],
        # Without duplicates in the plain handler's rows the faults did not reach the
        # handlers while they wrote, and the fenced handler's zero shows nothing.
        "plain_shows_duplicates": plain["duplicated"] > 0,
        "completed_twice": run["completed_twice"],
        "every_fault_kind_injected": faults_injected,
    }


def describe(run: dict[str, Any]) -> list[str]:
    """A line per handler and one for the faults, for the terminal."""
    lines = []
    for name, figures in run["handlers"].items():
        lines.append(
            f"{name}: {figures['jobs_succeeded']}/{figures['jobs']} succeeded, "
            f"{figures['handler_runs']} runs, {figures['rows']} rows, "
            f"{figures['missing']} missing, {figures['duplicated']} duplicated, "
            f"{figures['completions_refused']} completions refused (LeaseLost)"
        )
    faults = ", ".join(f"{n} {kind}" for kind, n in sorted(run["faults_injected"].items()))
    lines.append(f"faults: {faults or 'none'}; {run['wall_seconds'] or 0:.1f} s")
    return lines


@click.command("effects")
@click.option(
    "--jobs", type=click.IntRange(1), default=2000, show_default=True, help="Per handler."
)
@click.option("--workers", type=click.IntRange(1), default=4, show_default=True)
@click.option(
    "--concurrency", type=click.IntRange(1), default=4, show_default=True, help="Slots per worker."
)
@click.option("--lease-seconds", type=click.FloatRange(min=0.5), default=2.0, show_default=True)
@click.option(
    "--work-ms",
    default="100-400",
    show_default=True,
    callback=seconds_range,
    metavar="MIN-MAX",
    help="Milliseconds each handler works after its write, drawn from this range.",
)
@click.option(
    "--fault-every",
    default="1-3",
    show_default=True,
    callback=seconds_range,
    metavar="MIN-MAX",
    help="Seconds of quiet before each fault, drawn at random from this range.",
)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--timeout", type=click.FloatRange(min=1), default=1800, show_default=True)
@click.option("--quick", is_flag=True, help="200 jobs per handler.")
@click.option(
    "--database-url",
    envvar="DATABASE_URL",
    help="Only picks the PostgreSQL version: the run always has a private cluster of it.",
)
@results_dir_option
def effects_command(
    jobs: int,
    workers: int,
    concurrency: int,
    lease_seconds: float,
    work_ms: tuple[float, float],
    fault_every: tuple[float, float],
    seed: int,
    timeout: float,
    quick: bool,
    database_url: str | None,
    results_dir: str | None,
) -> None:
    """Side effects under chaos: a fenced handler's rows exactly once, a plain one's not."""
    scenario = EffectsScenario(
        jobs=min(jobs, 200) if quick else jobs,
        workers=workers,
        concurrency=concurrency,
        lease_seconds=lease_seconds,
        work_ms=work_ms,
        fault_every=fault_every,
        timeout=timeout,
        seed=seed,
    )
    with (
        LiveLine() as progress,
        tempfile.TemporaryDirectory(prefix="pgqueue-effects-") as run_dir,
    ):
        run, server_env = run_effects(
            scenario, run_dir=Path(run_dir), like_url=database_url, progress=progress
        )
    for line in describe(run):
        click.echo(line)
    summary = verdict(run)
    parameters = {
        **asdict(scenario),
        "fault_kinds": list(FAULT_KINDS),
        "server": "a private cluster, stopped with pg_ctl stop -m immediate and started again",
    }
    results.record(
        "effects",
        environment.describe_with(server_env),
        parameters=parameters,
        runs=[run],
        summary=summary,
        directory=results_dir,
    )
    if not summary["passed"]:
        failed = [
            name
            for name in (
                "every_job_succeeded",
                "fenced_exactly_once",
                "every_fault_kind_injected",
            )
            if not summary[name]
        ]
        raise click.ClickException(
            "the run failed its verdict"
            + (f" ({', '.join(failed)})" if failed else "")
            + ": see the figures above and the run in the results file"
        )
    if not summary["plain_shows_duplicates"]:
        click.echo(
            "note: the plain handler wrote no duplicate, so the faults never met a handler "
            "between its write and its ack: a longer run, or more frequent faults, shows more"
        )
