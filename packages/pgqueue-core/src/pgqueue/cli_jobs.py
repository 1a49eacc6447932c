"""The job commands: ``pgqueue enqueue``, ``status``, ``job``, ``cancel``, ``retry`` and
``prune``."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import click

from pgqueue import validation
from pgqueue.cli import (
    COMMAND_EXIT_STATUSES,
    ERROR_STATUS,
    EXIT_OK,
    USAGE_STATUS,
    _echo_json,
    database_options,
    exit_status_help,
    open_queue,
    parse_duration,
)
from pgqueue.dependencies import DEPENDENCY_MODES
from pgqueue.job import FINISHED_STATES, Job, JobState
from pgqueue.settings import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE

# With --wait: the job did not succeed (dead or cancelled), or was not final in time.
EXIT_JOB_FAILED = 4
EXIT_WAIT_TIMED_OUT = 5

WAIT_EXIT_STATUSES = exit_status_help(
    (EXIT_OK, "done (with --wait: the job succeeded)"),
    ERROR_STATUS,
    USAGE_STATUS,
    (EXIT_JOB_FAILED, "with --wait: the job ended dead or cancelled"),
    (EXIT_WAIT_TIMED_OUT, "with --wait: the job was not final when the wait ended"),
)


def _finite(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    # FloatRange lets NaN through (it compares false with both bounds).
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a number of seconds")
    return value


def wait_option(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The --wait option of ``enqueue`` and ``job``."""
    return click.option(
        "--wait",
        "wait_seconds",
        type=click.FloatRange(min=0, min_open=True, max=validation.MAX_SECONDS),
        callback=_finite,
        metavar="SECONDS",
        help=(
            f"Wait up to SECONDS for {what} to be final, then print it; the exit status "
            "says how it ended (see below)."
        ),
    )


def _exit_as_waited(job: Job, waited: float) -> None:
    """End a --wait command with the status of how ``job`` ended, and a line on stderr
    unless it succeeded (its JSON is already printed)."""
    if job.state is JobState.SUCCEEDED:
        return
    if job.state.finished:
        reason = f": {job.last_error}" if job.last_error else ""
        click.echo(f"job {job.id} ended {job.state.value}{reason}", err=True)
        raise SystemExit(EXIT_JOB_FAILED)
    click.echo(f"job {job.id} is still {job.state.value} after waiting {waited:g} s", err=True)
    raise SystemExit(EXIT_WAIT_TIMED_OUT)


@click.command(epilog=WAIT_EXIT_STATUSES)
@click.argument("task")
@click.option("--payload", default="{}", show_default=True, help="Job payload, a JSON object.")
@click.option("--queue", default=DEFAULT_QUEUE, show_default=True)
@click.option("--priority", type=int, default=0, show_default=True, help="Higher runs first.")
@click.option("--delay", "delay_seconds", type=float, help="Seconds before the job may run.")
@click.option("--idempotency-key", help="Enqueue at most once per key.")
@click.option(
    "--unique-key", help="While a queued or running job holds this key, print that job instead."
)
@click.option("--max-attempts", type=int, default=DEFAULT_MAX_ATTEMPTS, show_default=True)
@click.option("--timeout", "timeout_seconds", type=float, help="Per-attempt time limit in seconds.")
@click.option(
    "--depends-on",
    "depends_on",
    type=click.IntRange(min=1),
    multiple=True,
    metavar="JOB_ID",
    help="Wait until this job has succeeded (repeatable); cancelled if it ends dead or cancelled.",
)
@click.option(
    "--dependency-mode",
    type=click.Choice(DEPENDENCY_MODES),
    default="succeeded",
    show_default=True,
    help="finished: wait until every --depends-on job is final in any state, never cancelled.",
)
@click.option(
    "--tag",
    "tags",
    multiple=True,
    metavar="TAG",
    help="Label the job, to find it by (repeatable; at most 16, of 1 to 64 characters).",
)
@click.option(
    "--partition-key",
    metavar="KEY",
    help=(
        "The job's partition (1 to 200 characters, such as a tenant): keys take turns "
        "within a priority, and the queue's partition limits hold per key."
    ),
)
@wait_option("the job")
@database_options
def enqueue(
    task: str,
    payload: str,
    database_url: str | None,
    schema: str,
    wait_seconds: float | None,
    **options: Any,
) -> None:
    """Enqueue one TASK and print the job as JSON.

    With --depends-on, the job is waiting until those jobs have succeeded (queued at
    once if they already have); with --dependency-mode finished, until they are all
    final, whatever their state. With --wait, the job is printed once it is final (its
    result in "result"), and the exit status is 0 only if it succeeded: a shell script
    can run a job and check it."""
    try:
        body = json.loads(payload)
        _check_utf8(json.dumps(body, ensure_ascii=False), "--payload")
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint="--payload") from None
    except RecursionError:
        raise click.BadParameter("JSON nested too deeply", param_hint="--payload") from None
    for hint, value in (("TASK", task), ("--queue", options["queue"])):
        _check_utf8(value, hint)
    for name in ("idempotency_key", "unique_key", "partition_key"):
        if options[name] is not None:
            _check_utf8(options[name], f"--{name.replace('_', '-')}")
    for tag in options["tags"]:
        _check_utf8(tag, "--tag")
    with open_queue(database_url, schema) as queue:
        outcome = queue.enqueue(task, body, **options)
        job = outcome.job
        if wait_seconds is not None:
            job = queue.wait(job.id, wait_seconds)
    _echo_json({"created": outcome.created, "job": job.to_dict()})
    if wait_seconds is not None:
        _exit_as_waited(job, wait_seconds)


def _check_utf8(text: str, param_hint: str) -> None:
    # Arguments that are not UTF-8 reach Python as lone surrogates (as do "\ud800"
    # escapes in JSON), which neither psycopg nor PostgreSQL accept: a usage error here,
    # before the database, rather than a traceback from the driver.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise click.BadParameter(
            "is not valid UTF-8 (a lone surrogate or bytes of another encoding)",
            param_hint=param_hint,
        ) from None


@click.command(epilog=COMMAND_EXIT_STATUSES)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@database_options
def status(database_url: str | None, schema: str, as_json: bool) -> None:
    """Counts of jobs per queue and state.

    The unserved column counts queued jobs whose task no live worker serves in their
    queue, as the worker registry shows it (a misspelt task name, a queue nobody
    serves). The tasks are listed below the table. `pgqueue queue list` shows the
    queues' settings, `pgqueue workers` the workers."""
    with open_queue(database_url, schema) as queue:
        stats = queue.stats()
    if as_json:
        _echo_json([s.__dict__ for s in stats])
        return
    states = [s.value for s in JobState]
    header = ["queue", *states, "oldest runnable", "unserved"]
    rows = [
        [
            s.queue,
            *(str(s.counts[state]) for state in states),
            "-"
            if s.oldest_runnable_age_seconds is None
            else f"{s.oldest_runnable_age_seconds:.1f}s",
            str(sum(s.unserved.values())),
        ]
        for s in stats
    ]
    if not rows:
        click.echo(f"no jobs in schema {schema}")
        return
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        click.echo(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)).rstrip()
        )
    unserved = [(s.queue, task, jobs) for s in stats for task, jobs in s.unserved.items()]
    if unserved:
        click.echo("")
        for queue_name, task, jobs in unserved:
            click.echo(
                f"unserved: {jobs} {task!r} jobs in queue {queue_name!r}, and no live worker "
                f"serves task {task!r} in that queue"
            )


@click.command("job", epilog=WAIT_EXIT_STATUSES)
@click.argument("job_id", type=int)
@wait_option("it")
@database_options
def show_job(
    job_id: int, database_url: str | None, schema: str, wait_seconds: float | None
) -> None:
    """Show one job as JSON, with the errors of its failed attempts (the latest 20), the
    ids of the jobs it depends on (depends_on) and of those that depend on it
    (dependents), its tags and the latest progress its handler reported (progress:
    fraction, message and at; null until it reports).

    With --wait, once the job is final, or as it is when the wait ends; the exit status
    is 0 only if it succeeded."""
    with open_queue(database_url, schema) as queue:
        job = queue.get(job_id) if wait_seconds is None else queue.wait(job_id, wait_seconds)
        dependencies = queue.dependencies(job_id)
    _echo_json(
        {
            **job.to_dict(),
            "depends_on": dependencies.depends_on,
            "dependents": dependencies.dependents,
            "dependency_mode": dependencies.dependency_mode,
        }
    )
    if wait_seconds is not None:
        _exit_as_waited(job, wait_seconds)


@click.command(epilog=COMMAND_EXIT_STATUSES)
@click.argument("job_id", type=int)
@database_options
def cancel(job_id: int, database_url: str | None, schema: str) -> None:
    """Cancel a waiting, queued or running job, and the jobs waiting for it."""
    with open_queue(database_url, schema) as queue:
        job = queue.cancel(job_id)
    click.echo(f"job {job.id} cancelled")


@click.command(epilog=COMMAND_EXIT_STATUSES)
@click.argument("job_id", type=int)
@database_options
def retry(job_id: int, database_url: str | None, schema: str) -> None:
    """Put a dead or cancelled job back to queued (or waiting for its dependencies)."""
    with open_queue(database_url, schema) as queue:
        job = queue.retry(job_id)
    if job.state is JobState.WAITING:
        click.echo(f"job {job.id} waiting again for its dependencies")
    else:
        click.echo(f"job {job.id} queued again")


@click.command(epilog=COMMAND_EXIT_STATUSES)
@click.option(
    "--older-than",
    required=True,
    help="Age since the job finished, like 7d, 12h or 30m.",
)
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice([s.value for s in FINISHED_STATES]),
    help="Finished state to prune (repeatable). Default: all finished states.",
)
@click.option("--batch-size", type=click.IntRange(1, 100_000), default=1000, show_default=True)
@database_options
def prune(
    older_than: str, states: tuple[str, ...], batch_size: int, database_url: str | None, schema: str
) -> None:
    """Delete finished jobs, in small batches.

    Also creates the history's coming days (today and the next two) that are missing,
    when run as the role that owns them: a cron job that prunes in place of the workers'
    pruner keeps the days made too."""
    seconds = parse_duration(older_than)
    with open_queue(database_url, schema) as queue:
        # Under another role (a worker's, see docs/roles.md) the days are the owner's.
        made = queue.create_days() if queue.owns_history() else None
        deleted = queue.prune(seconds, states or FINISHED_STATES, batch_size=batch_size)
    if made is not None and made.created:
        click.echo(f"created the history's days {', '.join(made.created)}")
    if made is not None:
        for name, why in made.left.items():
            click.echo(f"{name} not created: {why}", err=True)
    click.echo(f"pruned {deleted} jobs")
