"""The workers' sync of schedules: each ``pgqueue worker``, as it starts, makes the
``schedules`` table follow the schedules its plugins declare, and logs each change
(:meth:`ScheduleSyncMethods.sync_schedules`):

- a schedule no row has is added, enabled;
- a schedule whose definition changed (cron, time zone, task, queue, payload,
  priority, attempts, plugin) is updated; a new cron or time zone moves its next run
  to the new expression's first tick;
- a row whose plugin the worker loaded but which that plugin no longer declares is
  disabled (``disabled_by`` ``sync``, ``removed_at`` set), never deleted: its history
  stays, and it comes back enabled if a plugin declares it again. Rows of plugins the
  worker did not load are left alone: another deployment's workers may load them.

The scheduler's round and the operator's switch are :mod:`pgqueue.schedule_store`.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from pgqueue import jsonb
from pgqueue.queries import one_row
from pgqueue.schedule_store import schedule_lock_key
from pgqueue.schedules import Schedule, next_tick, payload_json

log = logging.getLogger("pgqueue.schedules")


@dataclass
class SyncReport:
    """What a sync changed, by schedule name."""

    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


class ScheduleSyncMethods:
    """The sync's part of :class:`pgqueue.Queue` (which provides ``_connection``,
    ``_sql``, ``_rows`` and ``schema``)."""

    _connection: Any
    _sql: Any
    _rows: Any
    schema: str

    def sync_schedules(
        self, declared: Mapping[str, Schedule], plugins: Collection[str]
    ) -> SyncReport:
        """Make the table follow ``declared``, the schedules of the loaded ``plugins``
        (names, including those that declare none), and log each change. One sync at a
        time, and never during a scheduler round.

        A sync that would change nothing, what every worker but the first of a
        deployment finds, is one read: it takes no lock, so workers starting together
        do not wait for each other, nor for a scheduler round."""
        rows = {row["name"]: row for row in self._rows("schedule_list")}
        if not _sync_changes(rows, declared, plugins):
            return SyncReport(unchanged=sorted(declared))
        report = SyncReport()
        with self._connection() as conn:
            cur = jsonb.cursor(conn)
            cur.execute(self._sql("schedule_sync_lock"), {"key": schedule_lock_key(self.schema)})
            cur.execute(self._sql("schedule_list_locked"))
            rows = {row["name"]: row for row in cur.fetchall()}
            now = _database_now(cur, self._sql, rows)
            for name, schedule in sorted(declared.items()):
                row = rows.get(name)
                if row is None:
                    self._add(cur, schedule, now)
                    report.added.append(name)
                elif self._redefine(cur, schedule, row, now):
                    report.updated.append(name)
                else:
                    report.unchanged.append(name)
            gone = _no_longer_declared(rows, declared, plugins)
            if gone:
                cur.execute(self._sql("schedule_remove"), {"names": gone})
                for name in gone:
                    log.info(
                        "schedule %s disabled: plugin %s no longer declares it (its row and "
                        "history are kept)",
                        name,
                        rows[name]["source"],
                    )
                report.removed.extend(gone)
        return report

    def _add(self, cur: psycopg.Cursor[dict[str, Any]], schedule: Schedule, now: datetime) -> None:
        next_run_at = next_tick(schedule.expression, schedule.timezone, now)
        cur.execute(
            self._sql("schedule_insert"),
            {**_definition_params(schedule), "next_run_at": next_run_at},
        )
        log.info(
            "schedule %s added by plugin %s: %r (%s), task %s on queue %s, next run %s",
            schedule.name,
            schedule.source,
            schedule.expression,
            schedule.timezone,
            schedule.task,
            schedule.queue,
            next_run_at.isoformat(),
        )

    def _redefine(
        self,
        cur: psycopg.Cursor[dict[str, Any]],
        schedule: Schedule,
        row: Mapping[str, Any],
        now: datetime,
    ) -> bool:
        """Update ``row`` to ``schedule`` if it differs or was removed; True if it did."""
        changed = _changed_fields(schedule, row)
        returning = row["removed_at"] is not None
        if not changed and not returning:
            return False
        enabled, disabled_by = row["enabled"], row["disabled_by"]
        if returning and disabled_by == "sync":
            enabled, disabled_by = True, None
        retimed = "cron" in changed or "timezone" in changed
        next_run_at = None
        if enabled:
            next_run_at = row["next_run_at"]
            if retimed or next_run_at is None or not row["enabled"]:
                next_run_at = next_tick(schedule.expression, schedule.timezone, now)
        cur.execute(
            self._sql("schedule_redefine"),
            {
                **_definition_params(schedule),
                "enabled": enabled,
                "disabled_by": disabled_by,
                "next_run_at": next_run_at,
            },
        )
        what = "; ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in changed.items())
        if returning:
            what = "declared again" + (f"; {what}" if what else "")
        log.info(
            "schedule %s updated by plugin %s: %s (%s)",
            schedule.name,
            schedule.source,
            what,
            "enabled" if enabled else f"stays disabled by the {disabled_by}",
        )
        return True


def _database_now(
    cur: psycopg.Cursor[dict[str, Any]], sql: Any, rows: Mapping[str, Any]
) -> datetime:
    if rows:
        read: datetime = next(iter(rows.values()))["now"]
        return read
    cur.execute(sql("database_now"))
    now: datetime = one_row(cur)["now"]
    return now


def _definition_params(schedule: Schedule) -> dict[str, Any]:
    return {
        "name": schedule.name,
        "cron": schedule.expression,
        "timezone": schedule.timezone,
        "task": schedule.task,
        "queue": schedule.queue,
        "payload": payload_json(schedule.payload),
        "priority": schedule.priority,
        "max_attempts": schedule.max_attempts,
        "source": schedule.source,
    }


def _changed_fields(schedule: Schedule, row: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The fields of ``row`` that differ from ``schedule``'s definition: (old, new)."""
    wanted = schedule.definition()
    return {key: (row[key], value) for key, value in wanted.items() if row[key] != value}


def _no_longer_declared(
    rows: Mapping[str, Mapping[str, Any]],
    declared: Mapping[str, Schedule],
    plugins: Collection[str],
) -> list[str]:
    """The rows of loaded ``plugins`` that no plugin declares any more and that are not
    removed yet: the sync disables them."""
    return [
        name
        for name, row in rows.items()
        if name not in declared and row["source"] in plugins and row["removed_at"] is None
    ]


def _sync_changes(
    rows: Mapping[str, Mapping[str, Any]],
    declared: Mapping[str, Schedule],
    plugins: Collection[str],
) -> bool:
    """Whether a sync of ``declared`` would add, update or disable any of ``rows``."""
    for name, schedule in declared.items():
        row = rows.get(name)
        if row is None or row["removed_at"] is not None or _changed_fields(schedule, row):
            return True
    return bool(_no_longer_declared(rows, declared, plugins))
