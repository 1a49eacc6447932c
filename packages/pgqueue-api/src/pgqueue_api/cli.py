"""``pgqueue-api`` and ``pgqueue api``: serve the HTTP API with uvicorn.

Everything is checked before uvicorn starts (database reachable, schema migrated, port
free, token file readable), so a mistake is one clear line rather than a traceback.

Every flag can also be set by an environment variable (``--help`` names each one); a
flag wins over its variable, which wins over the default. The settings then reach the
worker processes as the environment variables of :mod:`pgqueue_api.settings`, because
uvicorn's workers import the app by name: those a flag sets are written from the
values click resolved, so nothing the user set is overwritten by a default.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import psycopg
import uvicorn
import uvicorn.config

from pgqueue import PgQueueError, connections, migrations
from pgqueue.cli_support import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    check_migrated,
    check_reachable,
    database_options,
    exit_status_help,
    resolve_url,
)
from pgqueue.errors import error_line
from pgqueue.settings import check_schema
from pgqueue_api import logs
from pgqueue_api import settings as api_settings
from pgqueue_api.settings import ApiSettings, SettingsError

APP_FACTORY = "pgqueue_api.app:create_app_from_env"
EXIT_STATUSES = exit_status_help(
    (EXIT_OK, "stopped cleanly by SIGTERM or SIGINT, with --workers 2 or more"),
    (EXIT_ERROR, "did not start: an error, said in one line (database unreachable,"),
    ("", "schema not migrated, port taken, unreadable token file, ...)"),
    (EXIT_USAGE, "a wrong flag or value"),
    (uvicorn.config.STARTUP_FAILURE, "uvicorn could not start serving (the app failed to start)"),
    # uvicorn's single server, once shut down gracefully, raises the signal it caught
    # again, so that the process ends as that signal would have ended it.
    (
        128 + signal.SIGINT,
        f"stopped cleanly by SIGINT, {128 + signal.SIGTERM} by SIGTERM, with one",
    ),
    ("", "worker process (128 + the signal's number, as a shell reports it)"),
)


_Command = TypeVar("_Command", bound=Callable[..., Any])


def _option(*names: str, envvar: str | list[str], **kwargs: Any) -> Callable[[_Command], _Command]:
    """An option that can also come from ``envvar`` (shown in --help)."""
    return click.option(*names, envvar=envvar, show_envvar=True, **kwargs)


@click.command(
    "api", context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_STATUSES
)
@click.version_option(package_name="pgqueue-api", prog_name="pgqueue-api")
@_option(
    "--host",
    envvar="PGQUEUE_API_HOST",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on.",
)
@_option(
    "--port",
    envvar="PGQUEUE_API_PORT",
    type=click.IntRange(1, 65535),
    default=8000,
    show_default=True,
    help="Port.",
)
@_option(
    "--workers",
    envvar="PGQUEUE_API_WORKERS",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Worker processes, each with its own connection pool.",
)
@database_options
@_option(
    "--token-file",
    envvar=api_settings.ENV_TOKEN_FILE,
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"File of bearer tokens, one per line; adds to {api_settings.ENV_TOKENS}.",
)
@_option(
    "--public-metrics",
    envvar=api_settings.ENV_PUBLIC_METRICS,
    is_flag=True,
    help="Serve /metrics without a token even when tokens are set.",
)
@_option(
    "--max-body-bytes",
    envvar=api_settings.ENV_MAX_BODY_BYTES,
    type=click.IntRange(1),
    default=api_settings.DEFAULT_MAX_BODY_BYTES,
    show_default=True,
    help="Larger request bodies get 413.",
)
@_option(
    "--pool-size",
    envvar=api_settings.ENV_POOL_SIZE,
    type=click.IntRange(2, 1000),
    default=api_settings.DEFAULT_POOL_SIZE,
    show_default=True,
    help="Database connections per worker process, at most: half for single-job "
    "enqueues, half for every other request.",
)
@_option(
    "--no-prepare",
    # The first is this command's own; the second is shared with `pgqueue worker`.
    envvar=["PGQUEUE_API_NO_PREPARE", "PGQUEUE_NO_PREPARE"],
    is_flag=True,
    help="No server-side prepared statements (PgBouncer in transaction mode). "
    f"{api_settings.ENV_PREPARE}=0 does the same.",
)
@_option(
    "--no-ui",
    envvar=api_settings.ENV_NO_UI,
    is_flag=True,
    help="Do not serve the dashboard under /ui.",
)
@_option(
    "--reject-unserved-tasks",
    envvar=api_settings.ENV_REJECT_UNSERVED_TASKS,
    is_flag=True,
    help="Refuse (422, naming the task) a job whose task no live worker serves in its "
    "queue, as the worker registry shows it (none while the registry is refilling after "
    "a crash, failover or restart).",
)
@_option(
    "--migrate",
    "run_migrations",
    envvar="PGQUEUE_API_MIGRATE",
    is_flag=True,
    help="Apply pending migrations first (otherwise the schema must be up to date).",
)
@_option(
    "--access-log/--no-access-log",
    envvar="PGQUEUE_API_ACCESS_LOG",
    default=True,
    show_default=True,
    help="One log line per request.",
)
@_option(
    "--log-level",
    envvar="PGQUEUE_API_LOG_LEVEL",
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
    default="info",
    show_default=True,
)
@_option(
    "--log-format",
    envvar="PGQUEUE_API_LOG_FORMAT",
    type=click.Choice(logs.FORMATS),
    default="text",
    show_default=True,
    help="json: one JSON object per line, with request_id (from X-Request-ID, or new) "
    "and job_id fields.",
)
def api(
    host: str,
    port: int,
    workers: int,
    database_url: str | None,
    schema: str,
    token_file: Path | None,
    public_metrics: bool,
    max_body_bytes: int,
    pool_size: int,
    no_prepare: bool,
    no_ui: bool,
    reject_unserved_tasks: bool,
    run_migrations: bool,
    access_log: bool,
    log_level: str,
    log_format: str,
) -> None:
    """Serve the pgqueue HTTP API.

    With no tokens configured (PGQUEUE_API_TOKENS or --token-file) the API is open to
    anyone who can reach it, and says so when it starts.
    """
    try:
        url = resolve_url(database_url)
        check_schema(schema)
        check_reachable(url)
        if run_migrations:
            applied = migrations.migrate(url, schema)
            if applied:
                click.echo(f"applied migrations {', '.join(map(str, applied))} to schema {schema}")
        with connections.connect(url) as conn:
            check_migrated(conn, schema, or_else=" or pass --migrate")
    except PgQueueError as exc:
        raise click.ClickException(str(exc)) from None
    except psycopg.Error as exc:
        raise click.ClickException(f"database error: {error_line(exc)}") from None

    # Each value is what click resolved: the flag, else its environment variable (the
    # same one the settings read, so a variable is handed on as it was set), else the
    # default. PGQUEUE_API_PREPARE=0 set by hand has no flag of its own: it is kept.
    prepare = not no_prepare and api_settings.is_true(os.environ.get(api_settings.ENV_PREPARE, "1"))
    os.environ.update(
        {
            api_settings.ENV_DATABASE_URL: url,
            api_settings.ENV_SCHEMA: schema,
            api_settings.ENV_PUBLIC_METRICS: "1" if public_metrics else "0",
            api_settings.ENV_MAX_BODY_BYTES: str(max_body_bytes),
            api_settings.ENV_POOL_SIZE: str(pool_size),
            api_settings.ENV_PREPARE: "1" if prepare else "0",
            api_settings.ENV_NO_UI: "1" if no_ui else "0",
            api_settings.ENV_REJECT_UNSERVED_TASKS: "1" if reject_unserved_tasks else "0",
        }
    )
    if token_file is not None:
        os.environ[api_settings.ENV_TOKEN_FILE] = str(token_file.resolve())
    try:
        # The workers build the same; fail here, once, if it is wrong.
        settings = ApiSettings.from_env()
    except (SettingsError, PgQueueError) as exc:
        raise click.ClickException(str(exc)) from None
    check_port_free(host, port)
    click.echo(describe_settings(settings, workers), err=True)

    uvicorn.run(
        APP_FACTORY,
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_config=logging_config(log_level, log_format),
        log_level=log_level,
        access_log=access_log,
    )


def main() -> None:
    """The ``pgqueue-api`` console script."""
    api(prog_name="pgqueue-api")


def describe_settings(settings: ApiSettings, workers: int) -> str:
    """One line, printed at start-up, with the settings every worker process serves
    with (so that an operator sees at once which of them came from where they meant)."""
    processes = f"{workers} worker process{'es' if workers > 1 else ''}"
    metrics = "public" if settings.public_metrics or not settings.auth_required else "token"
    return (
        f"pgqueue-api: schema {settings.schema}, {processes} with up to "
        f"{settings.pool_size} database connections each, request bodies up to "
        f"{settings.max_body_bytes} bytes, prepared statements "
        f"{'on' if settings.prepare else 'off'}, "
        f"{len(settings.tokens)} API token{'s' if len(settings.tokens) != 1 else ''}, "
        f"/metrics {metrics}, dashboard {'at /ui' if settings.ui else 'off'}"
    )


def check_port_free(host: str, port: int) -> None:
    """Fail with one line if ``host:port`` cannot be listened on (taken, or not ours)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # The same option uvicorn sets, so a port in TIME_WAIT is not taken for busy.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise click.ClickException(f"cannot listen on {host}:{port}: {reason}") from None


def logging_config(level: str = "info", log_format: str = "text") -> dict[str, Any]:
    """uvicorn's logging set-up, with pgqueue's own messages printed the same way, at
    the same ``--log-level``, as text or JSON (see :mod:`pgqueue_api.logs`)."""
    return logs.logging_config(level, log_format)
