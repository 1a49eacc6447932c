"""``pgqueue worker``: serve queues with the task handlers that plugins register.

Every flag can also come from the environment, as ``PGQUEUE_`` plus the flag in upper
snake case (``PGQUEUE_CONCURRENCY=8``); repeatable flags take comma-separated values
there (``PGQUEUE_QUEUE=emails,reports``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click
import pluggy

from pgqueue import DatabaseUnavailable, LifecycleHooks, Queue, ValidationError, validation
from pgqueue.backoff import DEFAULT_BASE_SECONDS, DEFAULT_CAP_SECONDS
from pgqueue.claiming import CLAIM_MODES, default_worker_id
from pgqueue.cli import database_options, not_migrated, parse_duration, resolve_url
from pgqueue.gc_tuning import tune_garbage_collector
from pgqueue.migrations import UnknownSchemaVersion
from pgqueue.plugins import (
    PluginLoadError,
    check_hooks,
    collect_tasks,
    get_plugin_manager,
    plugin_error,
)
from pgqueue.schedules import ScheduleError, collect_schedules
from pgqueue.settings import DEFAULT_LEASE_SECONDS, DEFAULT_QUEUE, check_schema
from pgqueue_worker import connections, logging_setup
from pgqueue_worker.handlers import import_module, load_handlers, merge_handlers
from pgqueue_worker.metrics import MetricsServer, WorkerMetrics
from pgqueue_worker.outage import why_unavailable
from pgqueue_worker.pruner import DEFAULT_PRUNE_INTERVAL, Retention
from pgqueue_worker.scheduler import ScheduleSync
from pgqueue_worker.signals import stop_on_signals
from pgqueue_worker.worker import (
    DEFAULT_ASYNC_CONCURRENCY,
    DEFAULT_CONCURRENCY,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_PREFETCH,
    DEFAULT_REAP_INTERVAL,
    DEFAULT_SHUTDOWN_TIMEOUT,
    Worker,
)

log = logging.getLogger("pgqueue.worker")

# Exit statuses of `pgqueue worker`, as its --help and docs/cli.md list them. A second
# SIGTERM or SIGINT exits with 128 + the signal's number (see signals.py), as a shell
# reports a process the signal killed.
EXIT_CLEAN = 0
EXIT_ERROR = 1  # a ClickException: one line on stderr, nothing claimed
EXIT_USAGE = 2  # click's status for a usage error
NO_HANDLERS_EXIT_CODE = EXIT_USAGE
SHUTDOWN_TIMED_OUT_EXIT_CODE = 3
DATABASE_GAVE_UP_EXIT_CODE = 4
# How long a --burst worker waits for an unreachable database before it gives up.
DEFAULT_BURST_GIVE_UP_AFTER = 60.0

NO_HANDLERS_HELP = """\
error: no task handlers, so this worker would have nothing to run. Add some:
  - install a plugin that registers tasks through the "pgqueue" entry-point group,
    for example: pip install pgqueue-examples
  - or pass --handlers module:ATTR, a dict of task name to callable,
    for example: --handlers myapp.tasks:HANDLERS
  - or pass --plugin module, a module with a @pgqueue.hookimpl register_tasks(register)
`pgqueue plugins` lists the plugins installed here."""

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


@dataclass(frozen=True)
class PreparedWorker:
    """A worker built from ``pgqueue worker``'s flags, connected and checked, not yet
    running."""

    runner: Worker
    queue: Queue
    hooks: LifecycleHooks
    metrics_server: MetricsServer | None = None
    """The --metrics-port server, serving until the worker stops."""

    def serve(self) -> int:
        """Run until stopped by SIGTERM or SIGINT (or, with ``--burst``, out of jobs),
        close the pool, and return the command's exit status."""
        tune_garbage_collector()
        gave_up: DatabaseUnavailable | None = None
        try:
            with stop_on_signals(self.runner):
                clean = self.runner.run()
        except DatabaseUnavailable as exc:  # only with give_up_after
            gave_up = exc
        finally:
            self.queue.close()
            if self.metrics_server is not None:
                self.metrics_server.close()
        if self.hooks.errors:
            counts = ", ".join(f"{name} {n}" for name, n in sorted(self.hooks.errors.items()))
            log.warning("lifecycle hooks raised and were ignored: %s", counts)
        if gave_up is not None:
            click.echo(f"Error: {gave_up}", err=True)
            return DATABASE_GAVE_UP_EXIT_CODE
        return EXIT_CLEAN if clean else SHUTDOWN_TIMED_OUT_EXIT_CODE


def prepare_worker(
    *,
    queues: tuple[str, ...],
    concurrency: int,
    async_concurrency: int,
    prefetch: int,
    handler_specs: tuple[str, ...],
    plugin_modules: tuple[str, ...],
    no_plugin_autoload: bool,
    lease_seconds: float,
    heartbeat_seconds: float | None,
    poll_interval: float,
    no_listen: bool,
    no_prepare: bool,
    prune_succeeded_after: float,
    prune_cancelled_after: float,
    prune_dead_after: float,
    prune_interval: float,
    reap_interval: float,
    claim_mode: str,
    retry_base: float,
    retry_cap: float,
    max_result_bytes: int,
    burst: bool,
    give_up_after: float | None,
    shutdown_timeout: float,
    log_format: str,
    log_level: str,
    database_url: str | None,
    schema: str,
    metrics_port: int | None = None,
    metrics_host: str = "0.0.0.0",
    no_scheduler: bool = False,
) -> PreparedWorker:
    """Everything ``pgqueue worker`` does before it starts claiming: logging, plugins and
    handlers, the connection pool, the check that the schema is migrated, and the
    :class:`Worker` itself. Takes the command's parsed flags, by their parameter names;
    a wrong flag raises a click usage error, and no handlers at all exits with status 2.
    """
    worker_id = default_worker_id()
    logging_setup.configure(log_format, log_level, worker_id=worker_id)
    queues = queues or (DEFAULT_QUEUE,)
    for name in queues:
        _checked(validation.name, "queue", name)
    _checked(check_schema, schema)

    pm = _plugin_manager(plugin_modules, autoload=not no_plugin_autoload)
    explicit: dict[str, Any] = {}
    for spec in handler_specs:
        try:
            explicit.update(load_handlers(spec))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--handlers") from None
    handlers = merge_handlers(collect_tasks(pm), explicit)
    if not handlers:
        click.echo(NO_HANDLERS_HELP, err=True)
        raise click.exceptions.Exit(NO_HANDLERS_EXIT_CODE)
    try:
        schedules = ScheduleSync(
            collect_schedules(pm), [name for name, plugin in pm.list_name_plugin() if plugin]
        )
    except ScheduleError as exc:
        raise click.ClickException(f"not starting: {exc}") from None

    url = resolve_url(database_url)
    metrics = None if metrics_port is None else WorkerMetrics()
    hooks = LifecycleHooks(pm)
    pool = connections.open_pool(url, application_name=connections.MAIN, prepare=not no_prepare)
    queue = Queue(
        pool,
        schema=schema,
        hooks=hooks,
        retry_base=retry_base,
        retry_cap=retry_cap,
        max_result_bytes=max_result_bytes,
    )
    try:
        _check_migrated(queue)
        runner = _checked(
            Worker,
            queue,
            handlers,
            queues=queues,
            concurrency=concurrency,
            async_concurrency=async_concurrency,
            prefetch=prefetch,
            lease_seconds=lease_seconds,
            heartbeat_seconds=heartbeat_seconds,
            poll_interval=poll_interval,
            listen=not no_listen,
            reap_interval=reap_interval,
            claim_mode=claim_mode,
            burst=burst,
            give_up_after=_give_up_after(give_up_after, burst=burst),
            shutdown_timeout=shutdown_timeout,
            worker_id=worker_id,
            retention=_checked(
                Retention,
                succeeded=prune_succeeded_after,
                cancelled=prune_cancelled_after,
                dead=prune_dead_after,
            ),
            prune_interval=prune_interval,
            metrics=metrics,
            schedules=schedules,
            scheduler=not no_scheduler,
        )
        # Last: a port that is taken stops the worker before it serves anything.
        server = None if metrics is None else _serve_metrics(metrics, metrics_host, metrics_port)
    except BaseException:
        queue.close()
        raise
    return PreparedWorker(runner, queue, hooks, server)


def _serve_metrics(metrics: WorkerMetrics, host: str, port: int | None) -> MetricsServer:
    """Serve ``metrics`` on ``host:port``, or fail in one line."""
    assert port is not None
    try:
        server = metrics.serve(port, host)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise click.ClickException(f"cannot serve metrics on {host}:{port}: {reason}") from None
    log.info("serving metrics on http://%s:%d/metrics", host, server.port)
    return server


def _give_up_after(seconds: float | None, *, burst: bool) -> float | None:
    """--give-up-after in seconds, or None for never: by default a --burst worker gives
    up (it is meant to finish), a long-running one waits for the database however long."""
    if seconds is None:
        return DEFAULT_BURST_GIVE_UP_AFTER if burst else None
    return seconds or None


def _checked(function: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``function``, turning a ValidationError into a usage error (exit 2)."""
    try:
        return function(*args, **kwargs)
    except ValidationError as exc:
        raise click.UsageError(str(exc)) from None


def _plugin_manager(modules: tuple[str, ...], *, autoload: bool) -> pluggy.PluginManager:
    try:
        pm = get_plugin_manager(load_entrypoints=autoload)
    except PluginLoadError as exc:
        # A worker without one of its plugins would leave that plugin's tasks queued,
        # or run them without its hooks: refuse to start instead.
        raise click.ClickException(f"not starting: {exc}") from None
    for name in modules:
        try:
            pm.register(import_module(name), name=name)
            check_hooks(pm, name)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--plugin") from None
        except pluggy.PluginValidationError as exc:  # a misspelled hook, wrong arguments
            raise click.BadParameter(plugin_error(exc), param_hint="--plugin") from None
    pm.check_pending()
    return pm


def _check_migrated(queue: Queue) -> None:
    """Fail now, with the fix, unless the schema has every migration this version of
    pgqueue ships. An unreachable database is not an error: the worker waits for it."""
    if why_unavailable(queue) is not None:
        # Found out on a connection of its own, at once, rather than after the pool's
        # wait for a connection that cannot come.
        return
    try:
        problem = queue.unmigrated()
    except DatabaseUnavailable:
        return
    except UnknownSchemaVersion as exc:
        raise click.ClickException(str(exc)) from None
    if problem:
        raise click.ClickException(not_migrated(queue.schema, problem))
