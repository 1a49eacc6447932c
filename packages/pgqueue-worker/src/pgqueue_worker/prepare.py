"""What ``pgqueue worker`` does with its parsed flags: build the worker, run it, exit.

:func:`prepare_worker` sets up logging, loads plugins and handlers, opens the pool,
checks that the schema is migrated and builds the :class:`~pgqueue_worker.worker.Worker`;
:meth:`PreparedWorker.serve` runs it and turns how it ended into the exit status.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import click
import pluggy

from pgqueue import DatabaseUnavailable, LifecycleHooks, Queue, ValidationError, validation
from pgqueue.claiming import default_worker_id
from pgqueue.cli_support import not_migrated, resolve_url
from pgqueue.gc_tuning import tune_garbage_collector
from pgqueue.migrations import UnknownSchemaVersion
from pgqueue.plugins import PluginLoadError, check_hooks, get_plugin_manager, plugin_error
from pgqueue.schedules import ScheduleError, collect_schedules
from pgqueue.settings import DEFAULT_QUEUE, check_schema
from pgqueue.task_handlers import collect_tasks
from pgqueue_worker import connections, logging_setup
from pgqueue_worker.handlers import import_module, load_handlers, merge_handlers
from pgqueue_worker.metrics import MetricsServer, WorkerMetrics
from pgqueue_worker.outage import why_unavailable
from pgqueue_worker.pruner import Retention
from pgqueue_worker.scheduler import ScheduleSync
from pgqueue_worker.signals import stop_on_signals
from pgqueue_worker.worker import Worker

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
