"""``pgqueue-api`` and ``pgqueue api``: serve the HTTP API with uvicorn.

Everything is checked before uvicorn starts (database reachable, schema migrated, port
free, token file readable), so a mistake is one clear line rather than a traceback.
Settings reach the worker processes as environment variables (see
:mod:`pgqueue_api.settings`), because uvicorn's workers import the app by name.
"""

from __future__ import annotations

import copy
import os
import socket
from pathlib import Path
from typing import Any

import click
import psycopg
import uvicorn
import uvicorn.config

from pgqueue import PgQueueError, migrations
from pgqueue.cli import check_reachable, database_options, resolve_url
from pgqueue.settings import check_schema
from pgqueue_api import settings as api_settings
from pgqueue_api.settings import ApiSettings, SettingsError

APP_FACTORY = "pgqueue_api.app:create_app_from_env"


@click.command("api", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="Port."
)
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Worker processes, each with its own connection pool.",
)
@database_options
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="File of bearer tokens, one per line; adds to PGQUEUE_API_TOKENS.",
)
@click.option(
    "--public-metrics",
    is_flag=True,
    help="Serve /metrics without a token even when tokens are set.",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(1),
    default=api_settings.DEFAULT_MAX_BODY_BYTES,
    show_default=True,
    help="Larger request bodies get 413.",
)
@click.option(
    "--pool-size",
    type=click.IntRange(1, 1000),
    default=api_settings.DEFAULT_POOL_SIZE,
    show_default=True,
    help="Database connections per worker process, at most.",
)
@click.option(
    "--no-prepare",
    is_flag=True,
    envvar="PGQUEUE_NO_PREPARE",
    help="No server-side prepared statements (PgBouncer in transaction mode).",
)
@click.option(
    "--migrate",
    "run_migrations",
    is_flag=True,
    help="Apply pending migrations first (otherwise the schema must be up to date).",
)
@click.option("--access-log/--no-access-log", default=True, show_default=True)
@click.option(
    "--log-level",
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
    default="info",
    show_default=True,
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
    run_migrations: bool,
    access_log: bool,
    log_level: str,
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
        check_migrated(url, schema)
    except PgQueueError as exc:
        raise click.ClickException(str(exc)) from None
    except psycopg.Error as exc:
        raise click.ClickException(f"database error: {_first_line(exc)}") from None

    os.environ.update(
        {
            api_settings.ENV_DATABASE_URL: url,
            api_settings.ENV_SCHEMA: schema,
            api_settings.ENV_PUBLIC_METRICS: "1" if public_metrics else "0",
            api_settings.ENV_MAX_BODY_BYTES: str(max_body_bytes),
            api_settings.ENV_POOL_SIZE: str(pool_size),
            api_settings.ENV_PREPARE: "0" if no_prepare else "1",
        }
    )
    if token_file is not None:
        os.environ[api_settings.ENV_TOKEN_FILE] = str(token_file.resolve())
    try:
        ApiSettings.from_env()  # the workers build the same; fail here, once, if it is wrong
    except (SettingsError, PgQueueError) as exc:
        raise click.ClickException(str(exc)) from None
    check_port_free(host, port)

    uvicorn.run(
        APP_FACTORY,
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_config=logging_config(),
        log_level=log_level,
        access_log=access_log,
    )


def main() -> None:
    """The ``pgqueue-api`` console script."""
    api(prog_name="pgqueue-api")


def check_migrated(url: str, schema: str) -> None:
    """Fail with one line unless every migration this version ships is applied."""
    with psycopg.connect(url, connect_timeout=5) as conn:
        done = set(migrations.applied(conn, schema))
    missing = [m.version for m in migrations.available() if m.version not in done]
    if missing:
        raise click.ClickException(
            f"schema {schema} lacks migrations {', '.join(map(str, missing))}: "
            "run `pgqueue migrate` or pass --migrate"
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


def logging_config() -> dict[str, Any]:
    """uvicorn's logging set-up, with pgqueue's own messages printed the same way."""
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["loggers"]["pgqueue"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return config


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
