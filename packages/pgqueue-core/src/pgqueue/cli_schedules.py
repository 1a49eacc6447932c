"""The schedule commands: ``pgqueue schedules`` and ``pgqueue schedule enable | disable``
(see :mod:`pgqueue.schedule_store`)."""

from __future__ import annotations

from datetime import datetime

import click

from pgqueue.cli_support import COMMAND_EXIT_STATUSES, _echo_json, database_options, open_queue
from pgqueue.schedules import ScheduleInfo


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else moment.isoformat(timespec="seconds")


def _enabled(info: ScheduleInfo) -> str:
    if info.enabled:
        return "yes"
    return "no (removed)" if info.disabled_by == "sync" else "no"


@click.command(epilog=COMMAND_EXIT_STATUSES)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@database_options
def schedules(database_url: str | None, schema: str, as_json: bool) -> None:
    """Every schedule the workers' plugins declared: name, cron, time zone, task, queue,
    whether it is enabled, and its next and last run (UTC). "no (removed)": its plugin
    no longer declares it. When a schedule is skipped because the scheduler cannot read
    its row, a last column says why ("skipped: ..."); its next run is then when the
    scheduler looks at it again."""
    with open_queue(database_url, schema) as queue:
        found = queue.schedules()
    if as_json:
        _echo_json([info.to_dict() for info in found])
        return
    if not found:
        click.echo(f"no schedules in schema {schema}")
        return
    header = ["name", "cron", "timezone", "task", "queue", "enabled", "next run", "last run"]
    rows = [
        [
            info.name,
            info.cron,
            info.timezone,
            info.task,
            info.queue,
            _enabled(info),
            _when(info.next_run_at),
            _when(info.last_run_at),
        ]
        for info in found
    ]
    if any(info.error is not None for info in found):
        header.append("problem")
        for row, info in zip(rows, found, strict=True):
            row.append("-" if info.error is None else f"skipped: {info.error}")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        click.echo(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


@click.group("schedule", epilog=COMMAND_EXIT_STATUSES)
def schedule_group() -> None:
    """Enable or disable a schedule for every worker. The switch holds across worker
    restarts and redeployments."""


def _switch(name: str, enabled: bool, database_url: str | None, schema: str) -> None:
    with open_queue(database_url, schema) as queue:
        info = queue.set_schedule_enabled(name, enabled)
    if info.enabled:
        click.echo(f"schedule {info.name} enabled: next run {_when(info.next_run_at)}")
    else:
        click.echo(f"schedule {info.name} disabled")


@schedule_group.command("enable", epilog=COMMAND_EXIT_STATUSES)
@click.argument("name")
@database_options
def schedule_enable(name: str, database_url: str | None, schema: str) -> None:
    """Enable schedule NAME: it runs from its next tick on (no runs for the ticks it
    spent disabled)."""
    _switch(name, True, database_url, schema)


@schedule_group.command("disable", epilog=COMMAND_EXIT_STATUSES)
@click.argument("name")
@database_options
def schedule_disable(name: str, database_url: str | None, schema: str) -> None:
    """Disable schedule NAME: no worker enqueues it until it is enabled again."""
    _switch(name, False, database_url, schema)
