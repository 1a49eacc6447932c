"""The ``pgqueue`` command line: the root group and its commands.

Other distributions add subcommands (``worker``, ``api``, ``bench``) through the
``pgqueue.commands`` entry-point group; they reuse :func:`database_options` and
:func:`open_queue` (from :mod:`pgqueue.cli_support`, also importable from here) so
every command finds its database the same way.
"""

from __future__ import annotations

import click

from pgqueue.cli_jobs import cancel, enqueue, prune, retry, show_job, status
from pgqueue.cli_operating import queue_group, workers
from pgqueue.cli_schedules import schedule_group, schedules
from pgqueue.cli_setup import db, migrate, plugins, roles_group
from pgqueue.cli_support import (
    COMMAND_EXIT_STATUSES,
    COMMANDS_GROUP,
    ERROR_STATUS,
    EXIT_ERROR,
    EXIT_NOT_RUNNING,
    EXIT_OK,
    EXIT_USAGE,
    USAGE_STATUS,
    PgQueueGroup,
    check_migrated,
    check_reachable,
    connect_checked,
    database_options,
    exit_status_help,
    not_migrated,
    open_queue,
    parse_duration,
    resolve_url,
)
from pgqueue.dev import dev


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

# The commands live in modules of their own, by what they are for (each imports the
# shared options and helpers from pgqueue.cli_support).

for command in (
    migrate,
    enqueue,
    status,
    show_job,
    cancel,
    retry,
    prune,
    plugins,
    db,
    roles_group,
    workers,
    queue_group,
    schedules,
    schedule_group,
):
    main.add_command(command)


__all__ = [
    "COMMANDS_GROUP",
    "COMMAND_EXIT_STATUSES",
    "ERROR_STATUS",
    "EXIT_ERROR",
    "EXIT_NOT_RUNNING",
    "EXIT_OK",
    "EXIT_USAGE",
    "USAGE_STATUS",
    "PgQueueGroup",
    "check_migrated",
    "check_reachable",
    "connect_checked",
    "database_options",
    "exit_status_help",
    "main",
    "not_migrated",
    "open_queue",
    "parse_duration",
    "resolve_url",
]
