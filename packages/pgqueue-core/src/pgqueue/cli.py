"""The ``pgqueue`` command line.

Other distributions add subcommands (``worker``, ``api``, ``bench``) through the
``pgqueue.commands`` entry-point group; they reuse :func:`database_options` and
:func:`open_queue` from here so every command finds its database the same way.
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

from pgqueue import connections, embedded, migrations, roles
from pgqueue.dev import dev
from pgqueue.errors import NoDatabaseConfigured, PgQueueError, error_line, first_line
from pgqueue.job import FINISHED_STATES, JobState
from pgqueue.plugins import BrokenPlugin, describe_plugins, get_plugin_manager, plugin_error
from pgqueue.queue import Queue
from pgqueue.settings import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_QUEUE,
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


def check_migrated(conn: psycopg.Connection, schema: str) -> None:
    """Fail with one clear line unless ``schema`` has every migration this version of
    pgqueue ships (a command on an older or missing schema would otherwise fail
    half-way with a traceback)."""
    try:
        problem = migrations.unmigrated(conn, schema)
    except migrations.UnknownSchemaVersion as exc:
        raise click.ClickException(str(exc)) from None
    if problem:
        raise click.ClickException(not_migrated(schema, problem))


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


USAGE_STATUS = (EXIT_USAGE, "a wrong command, flag or argument")
ERROR_STATUS = (EXIT_ERROR, "an error, said in one line (no database, schema not migrated, ...)")
COMMAND_EXIT_STATUSES: str = exit_status_help((EXIT_OK, "done"), ERROR_STATUS, USAGE_STATUS)


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


@click.group(
    cls=PgQueueGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=exit_status_help(
        (EXIT_OK, "done"),
        ERROR_STATUS,
        USAGE_STATUS,
        ("", "`pgqueue worker`, `pgqueue api`, `pgqueue dev` and `pgqueue db status`"),
        ("", "have more: see their --help."),
    ),
)
@click.version_option(package_name="pgqueue-core", prog_name="pgqueue")
def main() -> None:
    """pgqueue: a durable, at-least-once job queue on PostgreSQL."""


@main.command(epilog=COMMAND_EXIT_STATUSES)
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


@main.command(epilog=COMMAND_EXIT_STATUSES)
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
@database_options
def enqueue(
    task: str,
    payload: str,
    database_url: str | None,
    schema: str,
    **options: Any,
) -> None:
    """Enqueue one TASK and print the job as JSON.

    With --depends-on, the job is waiting until those jobs have succeeded (queued at
    once if they already have)."""
    try:
        body = json.loads(payload)
        _check_utf8(json.dumps(body, ensure_ascii=False), "--payload")
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint="--payload") from None
    except RecursionError:
        raise click.BadParameter("JSON nested too deeply", param_hint="--payload") from None
    for hint, value in (("TASK", task), ("--queue", options["queue"])):
        _check_utf8(value, hint)
    for name in ("idempotency_key", "unique_key"):
        if options[name] is not None:
            _check_utf8(options[name], f"--{name.replace('_', '-')}")
    with open_queue(database_url, schema) as queue:
        outcome = queue.enqueue(task, body, **options)
    _echo_json({"created": outcome.created, "job": outcome.job.to_dict()})


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


@main.command(epilog=COMMAND_EXIT_STATUSES)
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


@main.command("job", epilog=COMMAND_EXIT_STATUSES)
@click.argument("job_id", type=int)
@database_options
def show_job(job_id: int, database_url: str | None, schema: str) -> None:
    """Show one job as JSON, with the errors of its failed attempts (the latest 20), the
    ids of the jobs it depends on (depends_on) and of those that depend on it
    (dependents)."""
    with open_queue(database_url, schema) as queue:
        job = queue.get(job_id)
        dependencies = queue.dependencies(job_id)
    _echo_json(
        {
            **job.to_dict(),
            "depends_on": dependencies.depends_on,
            "dependents": dependencies.dependents,
        }
    )


@main.command(epilog=COMMAND_EXIT_STATUSES)
@click.argument("job_id", type=int)
@database_options
def cancel(job_id: int, database_url: str | None, schema: str) -> None:
    """Cancel a waiting, queued or running job, and the jobs waiting for it."""
    with open_queue(database_url, schema) as queue:
        job = queue.cancel(job_id)
    click.echo(f"job {job.id} cancelled")


@main.command(epilog=COMMAND_EXIT_STATUSES)
@click.argument("job_id", type=int)
@database_options
def retry(job_id: int, database_url: str | None, schema: str) -> None:
    """Put a dead or cancelled job back to queued."""
    with open_queue(database_url, schema) as queue:
        job = queue.retry(job_id)
    click.echo(f"job {job.id} queued again")


@main.command(epilog=COMMAND_EXIT_STATUSES)
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
    """Delete finished jobs, in small batches."""
    seconds = parse_duration(older_than)
    with open_queue(database_url, schema) as queue:
        deleted = queue.prune(seconds, states or FINISHED_STATES, batch_size=batch_size)
    click.echo(f"pruned {deleted} jobs")


@main.command(
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


@main.group(epilog=COMMAND_EXIT_STATUSES)
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


# `pgqueue dev` stops its children when it stops: its status is theirs when one of them
# ended it (dev.py cannot import this module, which imports it).
dev.epilog = exit_status_help(
    (EXIT_OK, "stopped by Ctrl-C or SIGTERM"),
    (EXIT_ERROR, "did not start, said in one line (port taken, pgqueue-api or"),
    ("", "pgqueue-worker not installed, ...)"),
    USAGE_STATUS,
    ("1+", "the API or the worker exited by itself: the higher of their statuses,"),
    ("", "at least 1"),
)
main.add_command(dev)


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


main.add_command(roles_group)

# The operator's commands, in a module of their own (it imports this one).
from pgqueue.cli_operating import queue_group, workers  # noqa: E402

main.add_command(workers)
main.add_command(queue_group)

# The schedule commands, likewise.
from pgqueue.cli_schedules import schedule_group, schedules  # noqa: E402

main.add_command(schedules)
main.add_command(schedule_group)
