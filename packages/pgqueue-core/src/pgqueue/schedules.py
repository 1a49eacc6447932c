"""Periodic jobs: schedules that plugins declare, and when each one ticks.

A plugin declares schedules through the ``register_schedules`` hook::

    @pgqueue.hookimpl
    def register_schedules(register):
        register("nightly-report", "30 2 * * *", "report", timezone="Europe/Berlin")

``cron`` is a standard 5-field expression (minute hour day month weekday), or 6 fields
whose first is the second (``*/10 * * * * *``: every ten seconds); croniter reads it,
so its extensions (``@daily``, ``L``, ``#``) work too. ``timezone`` is an IANA name.

A declaration that cannot work fails when it is registered, in one line naming the
schedule and its plugin (so ``pgqueue worker`` does not start): an expression croniter
does not accept, one that never fires (``0 0 30 2 *``), an unknown time zone, a bad
task or queue name, a payload that is not a JSON object, or a name two declarations
share.

Ticks are wall-clock times in the schedule's time zone, turned into instants by
:func:`next_tick`. Where daylight saving time moves the clock:

- a wall time the clock skips (Europe/Berlin, 29 March 2026: 02:00 to 03:00) has no
  instant: a tick that falls in the gap fires once, at the end of the gap (03:00
  local). Several ticks in the gap (``*/15 2 * * *``) fire as that one.
- a wall time the clock passes twice (25 October 2026: 02:00 to 03:00 local, first
  in summer time, then in winter time) fires once, at its first occurrence, when the
  expression names its hours (``30 2 * * *`` runs once that night); an expression
  with every hour (``*/30 * * * *``, ``* * * * * *``) keeps its pace in real time
  and fires in both passes, as every other hour of the year.

Schedules in UTC, the default, never meet either.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from functools import cached_property
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pluggy
from croniter import CroniterBadDateError, CroniterError, croniter

from pgqueue import validation
from pgqueue.errors import PgQueueError, ValidationError, error_line
from pgqueue.jsonb import UndecodableJson
from pgqueue.settings import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE


class ScheduleError(PgQueueError):
    """A schedule declaration that cannot work, said in one line."""


class ScheduleNotFound(PgQueueError, LookupError):
    """No schedule has this name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"schedule {name!r} not found")
        self.name = name


@dataclass(frozen=True)
class Schedule:
    """A schedule as a plugin declares it: what to enqueue, and when.

    Construction checks every field and raises :class:`ScheduleError` (one line,
    naming the schedule) for one that cannot work.
    """

    name: str
    cron: str
    task: str
    payload: dict[str, Any] | None = None
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    timezone: str = "UTC"
    max_attempts: int | None = None
    source: str = "explicit"
    """The plugin that declared it."""

    def __post_init__(self) -> None:
        problem = definition_problem(
            self.name,
            self.cron,
            self.task,
            self.payload,
            self.queue,
            self.priority,
            self.timezone,
            self.max_attempts,
        )
        if problem is not None:
            where = f"schedule {self.name!r}" + (
                "" if self.source == "explicit" else f" of plugin {self.source}"
            )
            raise ScheduleError(f"{where}: {problem}")

    @cached_property
    def expression(self) -> str:
        """``cron`` with its fields one space apart, as it is stored and compared: a
        change of spacing alone is no new definition."""
        return " ".join(self.cron.split())

    def definition(self) -> dict[str, Any]:
        """The columns a sync compares with the stored row, as the row holds them."""
        return {
            "cron": self.expression,
            "timezone": self.timezone,
            "task": self.task,
            "queue": self.queue,
            "payload": self.payload or {},
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "source": self.source,
        }

    def job_max_attempts(self) -> int:
        """The attempts each of its jobs gets."""
        return DEFAULT_MAX_ATTEMPTS if self.max_attempts is None else self.max_attempts


def definition_problem(
    name: object,
    cron: object,
    task: object,
    payload: object,
    queue: object,
    priority: object,
    timezone: object,
    max_attempts: object,
) -> str | None:
    """Why a schedule with this definition cannot work, in one line (without its
    name); None when it can. The checks of a declaration, and of a stored row."""
    try:
        validation.name("name", name)
        validation.name("task", task)
        validation.name("queue", queue)
        validation.priority(priority)
        if max_attempts is not None:
            validation.max_attempts(max_attempts)
        if payload is not None:
            validation.payload(payload)
    except ValidationError as exc:
        return str(exc)
    if not isinstance(cron, str):
        return "cron must be a string"
    try:
        zone(timezone)
        next_tick(" ".join(cron.split()), str(timezone), datetime.now(UTC))
    except ScheduleError as exc:
        return str(exc)
    return None


def row_problem(row: Mapping[str, Any]) -> str | None:
    """Why a ``schedules`` row cannot run, in one line; None when it can. Rows come
    from every worker's sync, whatever its version, and may be written by hand: a time
    zone or a cron expression this version does not read, or a payload Python cannot
    decode (read through :func:`pgqueue.jsonb.cursor`), is the row's own problem."""
    payload = row["payload"]
    if isinstance(payload, UndecodableJson):
        return f"payload could not be decoded: {payload.reason}"
    return definition_problem(
        row["name"],
        row["cron"],
        row["task"],
        payload,
        row["queue"],
        row["priority"],
        row["timezone"],
        row["max_attempts"],
    )


@dataclass(frozen=True)
class ScheduleInfo:
    """A schedule as the database holds it."""

    name: str
    cron: str
    timezone: str
    task: str
    queue: str
    payload: dict[str, Any]
    priority: int
    max_attempts: int | None
    source: str
    """The plugin that declares it."""
    enabled: bool
    disabled_by: str | None
    """``operator`` or ``sync`` (its plugin no longer declares it); None while enabled."""
    removed_at: datetime | None
    """When a sync found its plugin no longer declares it; None while declared."""
    next_run_at: datetime | None
    """Its next tick; None while disabled."""
    last_run_at: datetime | None
    """When its last job was enqueued (database clock)."""
    last_tick_at: datetime | None
    """The tick that job was for."""
    last_job_id: int | None
    created_at: datetime
    updated_at: datetime
    error: str | None = None
    """Why the scheduler skips it: what it found when it last looked at the row (an
    unknown time zone, a cron expression or a payload it cannot read); None while the
    schedule runs. A skipped schedule's ``next_run_at`` is when it is looked at again."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ScheduleInfo:
        """From a ``schedules`` row."""
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})

    def to_dict(self) -> dict[str, Any]:
        """As plain data (datetimes stay datetimes). Not a deep copy: a payload that
        could not be decoded stays the :class:`~pgqueue.jsonb.UndecodableJson` text it
        was read as (``asdict`` would copy it, which it cannot be)."""
        return {item.name: getattr(self, item.name) for item in fields(self)}


def zone(name: object) -> ZoneInfo:
    """The IANA time zone ``name``; raises :class:`ScheduleError` for an unknown one."""
    if not isinstance(name, str) or not name:
        raise ScheduleError("timezone must be an IANA time zone name, like Europe/Berlin")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"unknown time zone {name!r}") from None


def _parse(cron: str, start: datetime) -> croniter:
    """croniter over ``cron`` from ``start``: 5 fields, or 6 with the seconds first."""
    fields = cron.split()
    if not fields or (len(fields) not in (5, 6) and not cron.startswith("@")):
        raise ScheduleError(
            f"invalid cron expression {cron!r}: 5 fields (minute hour day month weekday), "
            "or 6 with a leading seconds field"
        )
    try:
        return croniter(cron, start, second_at_beginning=len(fields) == 6)
    except (CroniterError, ValueError, KeyError, TypeError) as exc:
        # All of the message, not its first line: croniter wraps some failures' whole
        # traceback into its error, whose first line then says nothing.
        raise ScheduleError(f"invalid cron expression {cron!r}: {error_line(exc)}") from None


def _names_hours(iterator: croniter) -> bool:
    """True when the expression fires only at some hours of the day (``30 2 * * *``),
    False when at every hour (``*/5 * * * *``)."""
    return iterator.expanded[1] != ["*"]


def _repeated(moment: datetime) -> bool:
    """True when ``moment`` (aware, in its zone) is the second occurrence of a wall time
    that the clock passes twice (the hour after summer time ends)."""
    wall = moment.replace(tzinfo=None)
    tz = moment.tzinfo
    first = wall.replace(tzinfo=tz, fold=0)
    second = wall.replace(tzinfo=tz, fold=1)
    if first.utcoffset() == second.utcoffset():
        return False
    # Both must name that wall time: in a gap neither round-trips.
    if first.astimezone(UTC).astimezone(tz).replace(tzinfo=None) != wall:
        return False
    return moment.astimezone(UTC) == second.astimezone(UTC)


def ticks(cron: str, timezone: str, after: datetime) -> Iterator[datetime]:
    """The ticks of ``cron`` in ``timezone`` strictly after ``after`` (an aware
    datetime), as UTC datetimes, in order; see the module's documentation for DST."""
    if after.tzinfo is None:
        raise ValueError("after must be timezone-aware")
    tz = zone(timezone)
    iterator = _parse(cron, after.astimezone(tz))
    names_hours = _names_hours(iterator)
    while True:
        try:
            moment = iterator.get_next(datetime)
        except CroniterBadDateError:
            raise ScheduleError(f"cron expression {cron!r} never fires") from None
        if names_hours and _repeated(moment):
            continue
        yield moment.astimezone(UTC)


def next_tick(cron: str, timezone: str, after: datetime) -> datetime:
    """The first tick of ``cron`` in ``timezone`` strictly after ``after`` (aware), in
    UTC. A pure function: the scheduler passes the database's clock as ``after``."""
    return next(ticks(cron, timezone, after))


def tick_key(name: str, tick: datetime) -> str:
    """The idempotency key of schedule ``name``'s job for ``tick``: however many
    workers try, and however often, one job per tick."""
    stamp = tick.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    return f"schedule:{name}@{stamp}"


def collect_schedules(pm: pluggy.PluginManager) -> dict[str, Schedule]:
    """Every schedule the registered plugins declare through ``register_schedules``.

    Raises :class:`ScheduleError` for a declaration that cannot work, and for a name
    declared twice (by one plugin or two)."""
    schedules: dict[str, Schedule] = {}
    for impl in pm.hook.register_schedules.get_hookimpls():
        source = impl.plugin_name

        def register(
            name: str,
            cron: str,
            task: str,
            payload: dict[str, Any] | None = None,
            queue: str = DEFAULT_QUEUE,
            priority: int = 0,
            timezone: str = "UTC",
            max_attempts: int | None = None,
            *,
            _source: str = source,
        ) -> None:
            schedule = Schedule(
                name=name,
                cron=cron,
                task=task,
                payload=payload,
                queue=queue,
                priority=priority,
                timezone=timezone,
                max_attempts=max_attempts,
                source=_source,
            )
            if name in schedules:
                first = schedules[name].source
                raise ScheduleError(
                    f"schedule {name!r} is declared twice: by plugin {first} and by "
                    f"plugin {_source}"
                    if first != _source
                    else f"schedule {name!r} is declared twice by plugin {_source}"
                )
            schedules[name] = schedule

        impl.function(register=register)
    return schedules


def payload_json(payload: dict[str, Any] | None) -> str:
    """A schedule's payload as the JSON text its row stores."""
    return json.dumps(payload or {}, sort_keys=True)
