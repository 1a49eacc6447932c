"""What every ``pgqueue`` command shares: the root group's class, the database options,
opening a checked Queue, durations, exit statuses and JSON output.

The commands of pgqueue-core (:mod:`pgqueue.cli_jobs`, :mod:`pgqueue.cli_operating`,
:mod:`pgqueue.cli_schedules`, :mod:`pgqueue.cli_setup`) and of other distributions
(``worker``, ``api``, ``bench``) import them from here; :mod:`pgqueue.cli` assembles
the commands into ``pgqueue``.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from importlib import metadata
from typing import Any

import click
import pluggy
import psycopg

from pgqueue import connections, migrations
from pgqueue.errors import NoDatabaseConfigured, PgQueueError, error_line, first_line
from pgqueue.plugins import plugin_error
from pgqueue.queue import Queue
from pgqueue.settings import (
    DEFAULT_SCHEMA,
    check_schema,
    resolve_database_url,
)

COMMANDS_GROUP = "pgqueue.commands"

# Exit statuses of the `pgqueue` commands, as each one's --help lists them: click's own
# (0, 1 for a ClickException, which prints one line, and 2 for a usage error), and 3 for
# `pgqueue db status` on a server that is not running, as `pg_ctl status` does.
# `pgqueue worker` and `pgqueue dev` add theirs in their own --help.
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_RUNNING = 3
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_MISSING_RELATION = re.compile(r'relation "(?:([a-z_][a-z0-9_]*)\.)?[^"]*" does not exist')


class PgQueueGroup(click.Group):
    """The root group: built-in commands plus those installed under ``pgqueue.commands``,
    and one-line errors instead of tracebacks for everything pgqueue raises on purpose."""

    def _plugin_commands(self) -> dict[str, metadata.EntryPoint]:
        return {ep.name: ep for ep in metadata.entry_points(group=COMMANDS_GROUP)}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._plugin_commands()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        entry_point = self._plugin_commands().get(cmd_name)
        if entry_point is None:
            return None
        try:
            command = entry_point.load()
        except Exception as exc:
            # A broken add-on must not take the whole CLI down with it.
            click.echo(
                f"warning: command {cmd_name!r} ({entry_point.value}) could not be loaded: "
                f"{type(exc).__name__}: {error_line(exc)}",
                err=True,
            )
            return None
        if not isinstance(command, click.Command):
            click.echo(
                f"warning: command {cmd_name!r} ({entry_point.value}) is not a click command",
                err=True,
            )
            return None
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PgQueueError as exc:
            raise click.ClickException(str(exc)) from None
        except psycopg.errors.UndefinedTable as exc:
            # The commands check the schema before they start; this is for a schema
            # dropped or never migrated behind the check's back, or a command that has none.
            match = _MISSING_RELATION.search(str(exc))
            schema = match[1] if match and match[1] else DEFAULT_SCHEMA
            raise click.ClickException(f"{not_migrated(schema)} ({first_line(exc)})") from None
        except pluggy.PluginValidationError as exc:
            raise click.ClickException(plugin_error(exc)) from None
        except psycopg.OperationalError as exc:
            raise click.ClickException(f"database error: {error_line(exc)}") from None


def database_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--database-url`` (or PGQUEUE_DATABASE_URL, or DATABASE_URL) and ``--schema``
    (or PGQUEUE_SCHEMA)."""

    @click.option(
        "--database-url",
        envvar=["PGQUEUE_DATABASE_URL", "DATABASE_URL"],
        show_envvar=True,
        help="PostgreSQL URL. Default: the embedded server, if `pgqueue db start` is running.",
    )
    @click.option(
        "--schema",
        envvar="PGQUEUE_SCHEMA",
        show_envvar=True,
        default=DEFAULT_SCHEMA,
        show_default=True,
        help="Schema that holds the jobs table.",
    )
    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return command(*args, **kwargs)

    return wrapper


def resolve_url(database_url: str | None) -> str:
    """The database URL for a command, or a one-line error saying how to give one."""
    try:
        return resolve_database_url(database_url)
    except NoDatabaseConfigured as exc:
        raise click.UsageError(str(exc)) from None


def connect_checked(url: str) -> psycopg.Connection:
    """A connection to ``url``, or a one-line error that keeps everything libpq said
    (host, port, cause and hint)."""
    try:
        return connections.connect(url)
    except psycopg.Error as exc:
        raise click.ClickException(f"cannot connect to the database: {error_line(exc)}") from None


def check_reachable(url: str) -> None:
    """Fail with one clear line if the database cannot be reached."""
    with connect_checked(url):
        pass


def not_migrated(schema: str, problem: str | None = None) -> str:
    """The one line that says what ``schema`` lacks (``problem``, from
    :func:`pgqueue.migrations.unmigrated`; by default, every migration), and the command
    that applies it."""
    command = "pgqueue migrate" + ("" if schema == DEFAULT_SCHEMA else f" --schema {schema}")
    return f"{problem or migrations.lacking(schema)}: run `{command}`"


def check_migrated(conn: psycopg.Connection, schema: str, *, or_else: str = "") -> None:
    """Fail with one clear line unless ``schema`` has every migration this version of
    pgqueue ships (a command on an older or missing schema would otherwise fail
    half-way with a traceback). ``or_else`` ends the line with the command's own way
    out (`` or pass --migrate``)."""
    try:
        problem = migrations.unmigrated(conn, schema)
    except migrations.UnknownSchemaVersion as exc:
        raise click.ClickException(str(exc)) from None
    if problem:
        raise click.ClickException(not_migrated(schema, problem) + or_else)


def open_queue(database_url: str | None, schema: str, **options: Any) -> Queue:
    """A Queue on the command's database, checked reachable and migrated first."""
    url = resolve_url(database_url)
    check_schema(schema)
    with connect_checked(url) as conn:
        check_migrated(conn, schema)
    # A one-shot command runs each statement a few times at most, so server-side
    # prepared statements gain it nothing, and without them every command also works
    # through PgBouncer in transaction mode (pgqueue prune runs one statement per batch).
    options.setdefault("prepare", False)
    return Queue.connect(url, schema=schema, min_size=1, max_size=2, **options)


def parse_duration(text: str) -> float:
    """Seconds in ``30s``, ``15m``, ``12h``, ``7d`` or ``2w`` (a bare number is seconds)."""
    match = _DURATION.match(text)
    if not match:
        raise click.BadParameter(f"{text!r} is not a duration like 30s, 15m, 12h, 7d or 2w")
    return float(match[1]) * _UNIT_SECONDS[match[2]]


def exit_status_help(*statuses: tuple[int | str, str]) -> str:
    """An ``Exit status:`` block for a command's ``--help`` epilog, one status a line
    (click prints a paragraph that starts with ``\\b`` as it is written)."""
    return "\n".join(["\b", "Exit status:", *(f"  {code!s:<4} {what}" for code, what in statuses)])


USAGE_STATUS: tuple[int, str] = (EXIT_USAGE, "a wrong command, flag or argument")
ERROR_STATUS: tuple[int, str] = (
    EXIT_ERROR,
    "an error, said in one line (no database, schema not migrated, ...)",
)
COMMAND_EXIT_STATUSES: str = exit_status_help((EXIT_OK, "done"), ERROR_STATUS, USAGE_STATUS)


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))
