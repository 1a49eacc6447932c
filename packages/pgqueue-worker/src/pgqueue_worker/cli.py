"""``pgqueue worker``: serve queues with the task handlers that plugins register.

Every flag can also come from the environment, as ``PGQUEUE_`` plus the flag in upper
snake case (``PGQUEUE_CONCURRENCY=8``); repeatable flags take comma-separated values
there (``PGQUEUE_QUEUE=emails,reports``).

This module is the command and its flags; what the command does with them is in
:mod:`pgqueue_worker.prepare`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from pgqueue import validation
from pgqueue.backoff import DEFAULT_BASE_SECONDS, DEFAULT_CAP_SECONDS
from pgqueue.claiming import CLAIM_MODES
from pgqueue.cli_support import database_options, parse_duration
from pgqueue.settings import DEFAULT_LEASE_SECONDS, DEFAULT_QUEUE
from pgqueue_worker import logging_setup
from pgqueue_worker.prepare import DEFAULT_BURST_GIVE_UP_AFTER, prepare_worker
from pgqueue_worker.pruner import DEFAULT_PRUNE_INTERVAL
from pgqueue_worker.worker import (
    DEFAULT_ASYNC_CONCURRENCY,
    DEFAULT_CONCURRENCY,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_PREFETCH,
    DEFAULT_REAP_INTERVAL,
    DEFAULT_SHUTDOWN_TIMEOUT,
)

SECONDS = click.FloatRange(min=0, min_open=True)


def _split(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """Repeatable flags also accept comma-separated values (as their variables must)."""
    return tuple(part.strip() for value in values for part in value.split(",") if part.strip())


def _duration(ctx: click.Context, param: click.Parameter, value: str) -> float:
    """A duration flag (``30s``, ``15m``, ``12h``, ``7d``, ``2w``) in seconds."""
    return parse_duration(value)


def _env(flag: str) -> str:
    return "PGQUEUE_" + flag.upper().replace("-", "_")


_Command = TypeVar("_Command", bound=Callable[..., Any])


def _option(flag: str, *names: str, **kwargs: Any) -> Callable[[_Command], _Command]:
    """A ``--flag`` option that can also be set as ``PGQUEUE_FLAG``."""
    return click.option(f"--{flag}", *names, envvar=_env(flag), show_envvar=True, **kwargs)


@click.command("worker")
@_option(
    "queue",
    "queues",
    multiple=True,
    callback=_split,
    metavar="NAME",
    help=f"Queue to serve (repeatable). Default: {DEFAULT_QUEUE}.",
)
@_option(
    "concurrency",
    type=click.IntRange(1, 1024),
    default=DEFAULT_CONCURRENCY,
    show_default=True,
    help="Thread slots: plain (def) handlers run at once.",
)
@_option(
    "async-concurrency",
    type=click.IntRange(1, 100_000),
    default=DEFAULT_ASYNC_CONCURRENCY,
    show_default=True,
    help="Coroutine slots: async def handlers run at once, on one event loop (they hold "
    "no thread while they await).",
)
@_option(
    "prefetch",
    type=click.IntRange(0, 100_000),
    default=DEFAULT_PREFETCH,
    show_default=True,
    help="Most jobs claimed ahead of free slots, for short jobs: only as many as the "
    "slots should start within 0.1 s at the handlers' recent pace. 0 claims only for "
    "free slots.",
)
@_option(
    "handlers",
    "handler_specs",
    multiple=True,
    callback=_split,
    metavar="MODULE:ATTR",
    help="A dict of task name to callable, added to the plugins' handlers (repeatable).",
)
@_option(
    "plugin",
    "plugin_modules",
    multiple=True,
    callback=_split,
    metavar="MODULE",
    help="A module to register as a plugin: its tasks and hooks (repeatable).",
)
@_option(
    "no-plugin-autoload",
    is_flag=True,
    help='Do not load the plugins installed under the "pgqueue" entry-point group.',
)
@_option(
    "lease-seconds",
    type=SECONDS,
    default=DEFAULT_LEASE_SECONDS,
    show_default=True,
    help="A claimed job's lease; the heartbeat extends it while the handler runs.",
)
@_option(
    "heartbeat-seconds",
    type=SECONDS,
    help="How often leases are extended. Default: a third of --lease-seconds.",
)
@_option(
    "poll-interval",
    type=SECONDS,
    default=DEFAULT_POLL_INTERVAL,
    show_default=True,
    help="Look for runnable jobs at least this often (LISTEN/NOTIFY wakes it sooner).",
)
@_option(
    "no-listen", is_flag=True, help="Poll only: no LISTEN (for PgBouncer in transaction mode)."
)
@_option(
    "no-prepare",
    is_flag=True,
    help="No server-side prepared statements (for PgBouncer in transaction mode).",
)
@_option(
    "reap-interval",
    type=SECONDS,
    default=DEFAULT_REAP_INTERVAL,
    show_default=True,
    help="How often to look for expired leases, in every queue of the schema (one worker "
    "at a time does).",
)
@_option(
    "prune-succeeded-after",
    default="7d",
    show_default=True,
    callback=_duration,
    metavar="DURATION",
    help="Delete succeeded jobs this long after they finished (0: keep them).",
)
@_option(
    "prune-cancelled-after",
    default="7d",
    show_default=True,
    callback=_duration,
    metavar="DURATION",
    help="Delete cancelled jobs this long after they were cancelled (0: keep them).",
)
@_option(
    "prune-dead-after",
    default="30d",
    show_default=True,
    callback=_duration,
    metavar="DURATION",
    help="Delete dead jobs this long after they died (0: keep them).",
)
@_option(
    "prune-interval",
    default=f"{DEFAULT_PRUNE_INTERVAL:g}s",
    show_default=True,
    callback=_duration,
    metavar="DURATION",
    help="How often to prune finished jobs of every queue of the schema, in small batches, "
    "one worker at a time (0: never).",
)
@_option(
    "no-scheduler",
    is_flag=True,
    help="Never enqueue due schedules here (other workers do, one at a time); this "
    "worker still writes its plugins' schedules to the database when it starts.",
)
@_option(
    "claim-mode",
    type=click.Choice(CLAIM_MODES),
    default="skip-locked",
    show_default=True,
    help="Row locking of claims; for-update exists for comparison.",
)
@_option(
    "retry-base",
    type=SECONDS,
    default=DEFAULT_BASE_SECONDS,
    show_default=True,
    help="Backoff after the first failed attempt, doubling after each (seconds).",
)
@_option(
    "retry-cap",
    type=SECONDS,
    default=DEFAULT_CAP_SECONDS,
    show_default=True,
    help="The longest backoff (seconds).",
)
@_option(
    "max-result-bytes",
    type=click.IntRange(1, validation.BYTE_LIMIT_MAX),
    default=validation.RESULT_MAX_BYTES,
    show_default=True,
    help="The largest result a handler may return, as JSON text; a larger one fails "
    "its attempt with both sizes in the error.",
)
@_option(
    "burst",
    is_flag=True,
    help="Exit 0 once no job this worker could claim is runnable now (after reaping "
    "expired leases, which puts their jobs back after a backoff).",
)
@_option(
    "give-up-after",
    callback=lambda ctx, param, value: None if value is None else parse_duration(value),
    metavar="DURATION",
    help="Exit with status 4 once the database has been unreachable this long (0: "
    f"never). Default: {DEFAULT_BURST_GIVE_UP_AFTER:g}s with --burst; without it, never "
    "(a long-running worker rides out outages of any length).",
)
@_option(
    "shutdown-timeout",
    type=click.FloatRange(min=0),
    default=DEFAULT_SHUTDOWN_TIMEOUT,
    show_default=True,
    help="On SIGTERM/SIGINT, how long running jobs may take to finish.",
)
@click.option(
    "--metrics-port",
    # The first names the worker, beside the API's settings in one environment; the
    # second follows this command's PGQUEUE_<FLAG> rule.
    envvar=["PGQUEUE_WORKER_METRICS_PORT", _env("metrics-port")],
    show_envvar=True,
    type=click.IntRange(1, 65535),
    metavar="PORT",
    help="Serve this process's Prometheus metrics over HTTP on this port (handler run "
    "times, pickup latency, claim sizes, heartbeat and outcome-write latency, attempts "
    "by outcome, database errors). Default: none.",
)
@click.option(
    "--metrics-host",
    envvar=["PGQUEUE_WORKER_METRICS_HOST", _env("metrics-host")],
    show_envvar=True,
    default="0.0.0.0",
    show_default=True,
    metavar="ADDRESS",
    help="Address the --metrics-port server listens on.",
)
@_option(
    "log-format",
    type=click.Choice(logging_setup.FORMATS),
    default="text",
    show_default=True,
)
@_option(
    "log-level",
    type=click.Choice(logging_setup.LEVELS),
    default="info",
    show_default=True,
    help="info logs one line per job state change.",
)
@database_options
@click.pass_context
def worker(ctx: click.Context, /, **options: Any) -> None:
    """Run task handlers on jobs claimed from the queue.

    Handlers come from installed plugins, --plugin modules and --handlers dicts.
    SIGTERM or SIGINT stops claiming and lets running jobs finish; a second signal
    exits at once, leaving running jobs to their leases.

    Reaping and pruning are schema-wide: every worker looks after every queue of its
    schema, not only those it serves with --queue, so that the jobs of a crashed
    worker come back, and old jobs go, even in a queue no running worker serves
    (one worker at a time does each). --prune-interval 0 leaves pruning to others.

    Schedules that plugins declare (register_schedules) are written to the database
    when the worker starts; one worker at a time enqueues their due ticks, one job per
    tick. --no-scheduler leaves that to others (a --burst worker never does it).

    \b
    Exit status:
      0    stopped cleanly: by SIGTERM/SIGINT once running jobs finished, or
           with --burst once nothing is runnable
      1    did not start: an error, said in one line (schema not migrated,
           a plugin that fails to load, a schedule that cannot work, ...)
      2    a wrong flag, or no task handlers
      3    the shutdown timeout left running jobs to their leases
      4    the database stayed unreachable for --give-up-after
      130  a second SIGINT, 143 a second SIGTERM (128 + the signal's number)
    """
    ctx.exit(prepare_worker(**options).serve())
