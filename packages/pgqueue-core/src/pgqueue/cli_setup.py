"""The set-up commands: ``pgqueue migrate``, ``plugins``, ``db`` (the embedded
PostgreSQL) and ``roles``."""

from __future__ import annotations

import click
import psycopg

from pgqueue import embedded, migrations, roles
from pgqueue.cli_support import (
    COMMAND_EXIT_STATUSES,
    EXIT_ERROR,
    EXIT_NOT_RUNNING,
    EXIT_OK,
    USAGE_STATUS,
    _echo_json,
    check_reachable,
    database_options,
    exit_status_help,
    resolve_url,
)
from pgqueue.errors import error_line
from pgqueue.plugins import BrokenPlugin, describe_plugins, get_plugin_manager
from pgqueue.settings import DEFAULT_SCHEMA, check_schema


@click.command(epilog=COMMAND_EXIT_STATUSES)
@database_options
def migrate(database_url: str | None, schema: str) -> None:
    """Create or upgrade the jobs table (safe to run from many processes at once)."""
    url = resolve_url(database_url)
    check_reachable(url)
    applied = migrations.migrate(url, schema)
    if applied:
        click.echo(f"applied migrations {', '.join(map(str, applied))} to schema {schema}")
    else:
        click.echo(f"schema {schema} is up to date")


@click.command(
    epilog=exit_status_help(
        (EXIT_OK, "every installed plugin loaded"),
        (EXIT_ERROR, "a plugin failed to load (listed with its entry point and error)"),
        USAGE_STATUS,
    )
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def plugins(as_json: bool) -> None:
    """Installed plugins, with their versions, tasks and hooks.

    A plugin that fails to load is listed with its entry point and error after the
    others, and the command then exits with status 1.
    """
    broken: list[BrokenPlugin] = []
    infos = describe_plugins(get_plugin_manager(broken=broken))
    if as_json:
        _echo_json([info.__dict__ for info in infos] + [b.__dict__ for b in broken])
    else:
        for info in infos:
            version = f" {info.version}" if info.version else " (built in)"
            click.echo(f"{info.name}{version}")
            click.echo(f"  tasks: {', '.join(info.tasks) or '-'}")
            click.echo(f"  hooks: {', '.join(info.hooks) or '-'}")
        for plugin in broken:
            version = f" {plugin.version}" if plugin.version else ""
            click.echo(f"{plugin.name}{version} (failed to load)")
            click.echo(f"  entry point: {plugin.entry_point}")
            click.echo(f"  error: {plugin.error}")
    if broken:
        names = ", ".join(plugin.name for plugin in broken)
        raise click.ClickException(f"{len(broken)} plugin(s) failed to load: {names}")


@click.group(epilog=COMMAND_EXIT_STATUSES)
def db() -> None:
    """The embedded PostgreSQL of this project (needs pgqueue-core[local]).

    Its data directory is PGQUEUE_PGDATA if set; otherwise, from the current directory
    upwards, the nearest .pgdata inside the project, else .pgdata at the project's root
    (the nearest directory holding .git, else pyproject.toml); outside any project,
    ./.pgdata. `pgqueue db status` shows which, and why.
    """


@db.command(
    "start",
    epilog=exit_status_help(
        (EXIT_OK, "running, migrated, its URL printed"),
        (EXIT_ERROR, "it could not start, said in one line"),
        USAGE_STATUS,
    ),
)
def db_start() -> None:
    """Start the embedded PostgreSQL, apply migrations, and print its URL."""
    url = embedded.start()
    migrations.migrate(url, DEFAULT_SCHEMA)
    click.echo(url)


@db.command(
    "stop",
    epilog=exit_status_help(
        (EXIT_OK, "stopped, or it was not running"),
        (EXIT_ERROR, "an error, said in one line"),
        USAGE_STATUS,
    ),
)
def db_stop() -> None:
    """Stop the embedded PostgreSQL."""
    if embedded.stop():
        click.echo("embedded PostgreSQL stopped")
    else:
        click.echo("embedded PostgreSQL was not running")


@db.command(
    "url",
    epilog=exit_status_help(
        (EXIT_OK, "its URL printed"),
        (EXIT_ERROR, "it is not running (`pgqueue db start` starts it)"),
        USAGE_STATUS,
    ),
)
def db_url() -> None:
    """Print the embedded PostgreSQL's URL (it must be running)."""
    url = embedded.running_url()
    if url is None:
        raise click.ClickException(
            f"the embedded PostgreSQL in {embedded.locate().path} is not running: "
            "run `pgqueue db start`"
        )
    click.echo(url)


@db.command(
    "status",
    epilog=exit_status_help(
        (EXIT_OK, "running"),
        (EXIT_ERROR, "an error, said in one line"),
        USAGE_STATUS,
        (EXIT_NOT_RUNNING, "not running (as `pg_ctl status` says it)"),
    ),
)
def db_status() -> None:
    """Where the embedded PostgreSQL keeps its data, why there, and whether it runs."""
    location = embedded.locate()
    click.echo(f"data directory: {location.path} ({location.reason})")
    url = embedded.running_url(location.path)
    if url is not None:
        click.echo(f"running: {url}")
        return
    version = embedded.initialised_version(location.path)
    if version is None:
        click.echo("not running: no cluster there yet (`pgqueue db start` creates one)")
    else:
        click.echo(f"not running: a PostgreSQL {version} cluster (`pgqueue db start` starts it)")
    raise click.exceptions.Exit(EXIT_NOT_RUNNING)


@click.group("roles", epilog=COMMAND_EXIT_STATUSES)
def roles_group() -> None:
    """Least-privilege PostgreSQL roles for a schema (see docs/roles.md)."""


@roles_group.command("grant", epilog=COMMAND_EXIT_STATUSES)
@database_options
def roles_grant(database_url: str | None, schema: str) -> None:
    """Create the schema's NOLOGIN group roles if missing (<schema>_producer, _worker,
    _operator, _owner) and grant each exactly what it needs. Run as a superuser, after
    `pgqueue migrate`, and again after every upgrade."""
    url = resolve_url(database_url)
    check_schema(schema)
    check_reachable(url)
    try:
        granted = roles.grant_roles(url, schema)
    except psycopg.Error as exc:
        raise click.ClickException(f"cannot grant the roles: {error_line(exc)}") from None
    for kind in ("producer", "worker", "operator", "owner"):
        click.echo(f"{kind}: {getattr(granted, kind)}")
