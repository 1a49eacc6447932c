"""The operator's commands: ``pgqueue workers`` and ``pgqueue queue list | pause |
resume | set | partitions`` (see :mod:`pgqueue.queue_control` and
:mod:`pgqueue.registry`)."""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from pgqueue.cli import COMMAND_EXIT_STATUSES, _echo_json, database_options, open_queue
from pgqueue.errors import QueueNotFound
from pgqueue.queue_control import PARTITIONS_PAGE_MAX, QueueInfo

# click types ParamType as generic from 8.2 on; older ones, which pgqueue accepts, cannot
# be subscripted at run time.
if TYPE_CHECKING:
    _ParamType = click.ParamType[Any]
else:
    _ParamType = click.ParamType


class _LimitType(_ParamType):
    """A limit: a number, or ``none`` for no limit."""

    def __init__(self, kind: type) -> None:
        self.kind = kind
        self.name = "N|none" if kind is int else "R|none"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or not isinstance(value, str):
            return value
        if value.strip().lower() == "none":
            return None
        try:
            number = self.kind(value)
        except ValueError:
            what = "a whole number" if self.kind is int else "a number"
            self.fail(f"{value!r} is not {what} or 'none'", param, ctx)
        if self.kind is float and not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def _table(header: Sequence[str], rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        click.echo(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


def _ago(moment: datetime) -> str:
    seconds = max(0.0, (datetime.now(UTC) - moment).total_seconds())
    return f"{seconds:.0f}s ago"


def _limit(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:g}{unit}"


def _until(moment: datetime | None) -> str:
    """A throttle's end in UTC, to the second; ``-`` for none, or one already over."""
    if moment is None or moment <= datetime.now(UTC):
        return "-"
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@click.command(epilog=COMMAND_EXIT_STATUSES)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@database_options
def workers(database_url: str | None, schema: str, as_json: bool) -> None:
    """The live workers, from the worker registry: id, host, pid, queues, tasks, jobs
    they hold claimed (running) and when they were last seen. A worker that died
    drops out once its row expires (three heartbeat intervals, 30 s by default)."""
    with open_queue(database_url, schema) as queue:
        found = queue.workers()
    if as_json:
        _echo_json([worker.to_dict() for worker in found])
        return
    if not found:
        click.echo(f"no live workers in schema {schema}")
        return
    header = ["id", "host", "pid", "queues", "tasks", "running", "last seen"]
    rows = [
        [
            w.id,
            w.host,
            str(w.pid),
            ",".join(w.queues),
            ",".join(w.tasks),
            f"{w.running}/{w.concurrency}",
            _ago(w.last_seen_at),
        ]
        for w in found
    ]
    _table(header, rows)


@click.group("queue", epilog=COMMAND_EXIT_STATUSES)
def queue_group() -> None:
    """List queues with their settings; pause, resume and limit them across every worker."""


@queue_group.command("list", epilog=COMMAND_EXIT_STATUSES)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@database_options
def queue_list(database_url: str | None, schema: str, as_json: bool) -> None:
    """Every queue: paused or not, its limits (per partition key too), until when it
    is throttled, and its jobs queued and running."""
    with open_queue(database_url, schema) as queue:
        stats = queue.stats()
    if as_json:
        _echo_json([s.__dict__ for s in stats])
        return
    if not stats:
        click.echo(f"no queues in schema {schema}")
        return
    header = [
        "queue",
        "paused",
        "concurrency limit",
        "rate limit",
        "per-key limit",
        "per-key rate",
        "throttled until",
        "queued",
        "running",
    ]
    rows = [
        [
            s.queue,
            "yes" if s.paused else "no",
            _limit(s.concurrency_limit),
            _limit(s.rate_limit, "/s"),
            _limit(s.partition_concurrency_limit),
            _limit(s.partition_rate_limit, "/s"),
            _until(s.throttled_until),
            str(s.counts["queued"]),
            str(s.counts["running"]),
        ]
        for s in stats
    ]
    _table(header, rows)


def _show(info: QueueInfo) -> None:
    # The partition limits and the throttle only when there are some: the line of a
    # queue that uses none reads as it always has.
    extra = ""
    if info.partition_concurrency_limit is not None or info.partition_rate_limit is not None:
        extra += (
            f", per-key concurrency limit {_limit(info.partition_concurrency_limit)}, "
            f"per-key rate limit {_limit(info.partition_rate_limit, '/s')}"
        )
    if _until(info.throttled_until) != "-":
        extra += f", throttled until {_until(info.throttled_until)}"
    click.echo(
        f"queue {info.queue}: {'paused' if info.paused else 'running'}, "
        f"concurrency limit {_limit(info.concurrency_limit)}, "
        f"rate limit {_limit(info.rate_limit, '/s')}{extra}"
    )


_CREATE = click.option("--create", is_flag=True, help="Configure a queue that has had no job yet.")


@queue_group.command("pause", epilog=COMMAND_EXIT_STATUSES)
@click.argument("name")
@_CREATE
@database_options
def queue_pause(name: str, create: bool, database_url: str | None, schema: str) -> None:
    """Stop every worker from starting jobs of queue NAME within a second; enqueues
    still land, and jobs already claimed finish."""
    with open_queue(database_url, schema) as queue:
        _show(queue.pause_queue(name, create=create))


@queue_group.command("resume", epilog=COMMAND_EXIT_STATUSES)
@click.argument("name")
@database_options
def queue_resume(name: str, database_url: str | None, schema: str) -> None:
    """Let workers start jobs of queue NAME again; waiting workers are woken at once."""
    with open_queue(database_url, schema) as queue:
        _show(queue.resume_queue(name))


@queue_group.command("set", epilog=COMMAND_EXIT_STATUSES)
@click.argument("name")
@click.option(
    "--concurrency-limit",
    type=_LimitType(int),
    help="Jobs of the queue running at once across every worker; 'none' removes it.",
)
@click.option(
    "--rate-limit",
    type=_LimitType(float),
    help="Jobs of the queue started per second across every worker; 'none' removes it.",
)
@click.option(
    "--partition-concurrency-limit",
    type=_LimitType(int),
    help=(
        "Jobs of one partition key running at once across every worker (keys at it "
        "wait, the others go on); 'none' removes it."
    ),
)
@click.option(
    "--partition-rate-limit",
    type=_LimitType(float),
    help="Jobs of one partition key started per second across every worker; 'none' removes it.",
)
@_CREATE
@database_options
def queue_set(
    name: str,
    create: bool,
    database_url: str | None,
    schema: str,
    **limits: Any,
) -> None:
    """Set the limits of queue NAME (a limit not given is left as it is)."""
    ctx = click.get_current_context()
    given = {
        option: value
        for option, value in limits.items()
        if ctx.get_parameter_source(option) is not click.core.ParameterSource.DEFAULT
    }
    with open_queue(database_url, schema) as queue:
        _show(queue.update_queue(name, create=create, **given))


@queue_group.command("partitions", epilog=COMMAND_EXIT_STATUSES)
@click.argument("name")
@click.option(
    "--limit",
    type=click.IntRange(1, PARTITIONS_PAGE_MAX),
    default=100,
    show_default=True,
    help="Keys to show, at most.",
)
@click.option(
    "--after",
    metavar="CURSOR",
    help="Go on after the page that printed this cursor (its next page).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@database_options
def queue_partitions(
    name: str,
    limit: int,
    after: str | None,
    as_json: bool,
    database_url: str | None,
    schema: str,
) -> None:
    """The partition keys of queue NAME, busiest first.

    Each key with queued or running jobs, or a throttle: its jobs queued and running,
    and until when it is throttled; ordered by running plus queued jobs, descending,
    then by key. A page at a time: a page that is not the last ends with the cursor of
    the next one (in JSON, next_after)."""
    with open_queue(database_url, schema) as queue:
        page = queue.partitions(name, limit=limit, after=after)
        if not page.partitions and after is None and name not in {s.queue for s in queue.stats()}:
            raise QueueNotFound(name)
    if as_json:
        _echo_json(
            {
                "partitions": [partition.to_dict() for partition in page.partitions],
                "next_after": page.next_after,
            }
        )
        return
    if not page.partitions:
        click.echo(f"no partition keys with jobs in queue {name}")
        return
    header = ["partition key", "queued", "running", "throttled until"]
    rows = [
        [p.partition_key, str(p.queued), str(p.running), _until(p.throttled_until)]
        for p in page.partitions
    ]
    _table(header, rows)
    if page.next_after is not None:
        click.echo(f"next page: --after {shlex.quote(page.next_after)}")
