"""Schedules in the database: the workers' sync, the scheduler's round, and the
operator's view and switch.

Rows live in the ``schedules`` table (see ``sql/schema.sql``), so every worker, the
API and the CLI see the same state.

Sync (:meth:`ScheduleMethods.sync_schedules`, run by each ``pgqueue worker`` as it
starts) makes the table follow the plugins the worker loaded, and logs each change:

- a schedule no row has is added, enabled;
- a schedule whose definition changed (cron, time zone, task, queue, payload,
  priority, attempts, plugin) is updated; a new cron or time zone moves its next run
  to the new expression's first tick;
- a row whose plugin the worker loaded but which that plugin no longer declares is
  disabled (``disabled_by`` ``sync``, ``removed_at`` set), never deleted: its history
  stays, and it comes back enabled if a plugin declares it again. Rows of plugins the
  worker did not load are left alone: another deployment's workers may load them.

The operator's switch (:meth:`ScheduleMethods.set_schedule_enabled`) wins over the
sync: a schedule the operator disabled stays disabled across restarts and
redefinitions, and one the operator enabled stays enabled, until the operator says
otherwise. Enabling a schedule starts it at its next tick from now, without runs for
the ticks it spent disabled.

The scheduler's round (:meth:`ScheduleMethods.run_due_schedules`) runs under a
transaction-level advisory lock, so one process at a time does it; in that one
transaction it enqueues one job for each schedule whose ``next_run_at`` has come, with
the idempotency key ``schedule:<name>@<tick in UTC>`` (so even two rounds that raced
could not enqueue a tick twice), and moves ``next_run_at`` to the first tick after
the database's clock. After downtime a schedule therefore runs once, for the first
tick it missed, whatever the number of ticks missed, and never runs a tick twice.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from pgqueue import jsonb
from pgqueue.errors import IdempotencyConflict, ValidationError
from pgqueue.job_spec import JobSpec
from pgqueue.locks import advisory_key
from pgqueue.queries import one_row
from pgqueue.schedules import (
    Schedule,
    ScheduleError,
    ScheduleInfo,
    ScheduleNotFound,
    next_tick,
    payload_json,
    tick_key,
    ticks,
)
from pgqueue.settings import DEFAULT_MAX_ATTEMPTS

log = logging.getLogger("pgqueue.schedules")

MISSED_TICKS_COUNTED = 1000
"""After downtime, missed ticks are counted (for the log) up to this many."""


@dataclass
class SyncReport:
    """What a sync changed, by schedule name."""

    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ScheduledRun:
    """One schedule's run in a scheduler round."""

    schedule: str
    tick: datetime
    job_id: int | None
    """None when the job could not be enqueued (see the log)."""
    created: bool
    """False when the tick already had its job."""


@dataclass(frozen=True)
class ScheduleRound:
    """What one scheduler round did."""

    ran: bool
    """False when another process held the scheduler's lock: this one did nothing."""
    runs: list[ScheduledRun]
    next_due_seconds: float | None
    """Seconds until the next tick of any enabled schedule (None: none is enabled)."""


class ScheduleMethods:
    """The schedules' part of :class:`pgqueue.Queue` (which provides ``_connection``,
    ``_sql``, ``_rows``, ``enqueue_many`` and ``schema``)."""

    _connection: Any
    _sql: Any
    _rows: Any
    enqueue_many: Any
    schema: str

    # -- the operator's view and switch ---------------------------------------------

    def schedules(self) -> list[ScheduleInfo]:
        """Every schedule, by name: enabled or not, removed or not."""
        return [ScheduleInfo.from_row(row) for row in self._rows("schedule_list")]

    def set_schedule_enabled(self, name: str, enabled: bool) -> ScheduleInfo:
        """Enable or disable schedule ``name``; the switch holds across worker restarts
        and redefinitions (see the module's documentation). An enabled schedule's next
        run is its first tick from now. Raises :class:`ScheduleNotFound`."""
        if not isinstance(enabled, bool):
            raise ValidationError("enabled", "must be true or false")
        with self._connection() as conn:
            cur = jsonb.cursor(conn)
            cur.execute(self._sql("schedule_get_locked"), {"name": name})
            row = cur.fetchone()
            if row is None:
                raise ScheduleNotFound(name)
            next_run_at = None
            if enabled:
                next_run_at = row["next_run_at"] if row["enabled"] else None
                if next_run_at is None:
                    next_run_at = next_tick(row["cron"], row["timezone"], row["now"])
            cur.execute(
                self._sql("schedule_set_enabled"),
                {"name": name, "enabled": enabled, "next_run_at": next_run_at},
            )
            info = ScheduleInfo.from_row(one_row(cur))
        log.info("schedule %s %s by the operator", name, "enabled" if enabled else "disabled")
        return info

    # -- the workers' sync ------------------------------------------------------------

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
            cur.execute(self._sql("schedule_sync_lock"), {"key": _lock_key(self.schema)})
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
        next_run_at = next_tick(schedule.cron, schedule.timezone, now)
        cur.execute(
            self._sql("schedule_insert"),
            {**_definition_params(schedule), "next_run_at": next_run_at},
        )
        log.info(
            "schedule %s added by plugin %s: %r (%s), task %s on queue %s, next run %s",
            schedule.name,
            schedule.source,
            schedule.cron,
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
                next_run_at = next_tick(schedule.cron, schedule.timezone, now)
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

    # -- the scheduler's round --------------------------------------------------------

    def run_due_schedules(self) -> ScheduleRound:
        """One scheduler round: if no other process is in one, enqueue a job for each
        enabled schedule whose tick has come and move it to its next tick, all in one
        transaction; see the module's documentation."""
        with self._connection() as conn:
            cur = jsonb.cursor(conn)
            cur.execute(self._sql("scheduler_try_lock"), {"key": _lock_key(self.schema)})
            if not one_row(cur)["locked"]:
                return ScheduleRound(False, [], _next_due(cur, self._sql))
            cur.execute(self._sql("schedules_due"))
            due = cur.fetchall()
            runs: list[ScheduledRun] = []
            moved: list[tuple[str, datetime, datetime | None, datetime | None, int | None]] = []
            for row in due:
                try:
                    following, run = self._run_one(conn, row)
                except ScheduleError as exc:
                    log.error("schedule %s cannot run: %s", row["name"], exc)
                    continue
                if run is not None:
                    runs.append(run)
                moved.append(
                    (
                        row["name"],
                        following,
                        row["now"] if run is not None and run.job_id is not None else None,
                        run.tick if run is not None else None,
                        run.job_id if run is not None else None,
                    )
                )
            if moved:
                names, next_run_ats, run_ats, tick_ats, job_ids = (
                    list(c) for c in zip(*moved, strict=True)
                )
                cur.execute(
                    self._sql("schedules_ran"),
                    {
                        "names": names,
                        "next_run_ats": next_run_ats,
                        "run_ats": run_ats,
                        "tick_ats": tick_ats,
                        "job_ids": job_ids,
                    },
                )
            return ScheduleRound(True, runs, _next_due(cur, self._sql))

    def _run_one(
        self, conn: psycopg.Connection, row: Mapping[str, Any]
    ) -> tuple[datetime, ScheduledRun | None]:
        """The next tick of the due schedule ``row`` and its run (None when the row only
        needed its next tick filled in), enqueued on ``conn``."""
        name, cron, timezone, now = row["name"], row["cron"], row["timezone"], row["now"]
        tick = row["next_run_at"]
        if tick is None:
            return next_tick(cron, timezone, now), None
        missed = 0
        following = None
        for moment in ticks(cron, timezone, tick):
            if moment > now:
                following = moment
                break
            missed += 1
            if missed >= MISSED_TICKS_COUNTED:
                following = next_tick(cron, timezone, now)
                break
        assert following is not None
        if missed:
            log.warning(
                "schedule %s missed %s%d more ticks after %s while no scheduler ran: "
                "it runs once for all of them, for that first tick",
                name,
                "at least " if missed >= MISSED_TICKS_COUNTED else "",
                missed,
                tick.isoformat(),
            )
        key = tick_key(name, tick)
        try:
            spec = JobSpec(
                task=row["task"],
                payload=row["payload"],
                queue=row["queue"],
                priority=row["priority"],
                idempotency_key=key,
                max_attempts=row["max_attempts"] or DEFAULT_MAX_ATTEMPTS,
            )
            result = self.enqueue_many([spec], conn=conn)[0]
        except IdempotencyConflict as exc:
            # The tick has its job, enqueued by an earlier definition: it stays the one.
            log.warning("schedule %s: tick %s already had a job: %s", name, tick, exc)
            return following, ScheduledRun(name, tick, None, False)
        except ValidationError as exc:
            log.error("schedule %s: tick %s enqueued nothing: %s", name, tick, exc)
            return following, ScheduledRun(name, tick, None, False)
        job = result.job
        if result.created:
            log.info(
                "schedule %s: enqueued job %d (%s on queue %s) for tick %s",
                name,
                job.id,
                job.task,
                job.queue,
                tick.isoformat(),
            )
        else:
            log.info("schedule %s: tick %s already had job %d", name, tick.isoformat(), job.id)
        return following, ScheduledRun(name, tick, job.id, result.created)

    # -- metrics ----------------------------------------------------------------------

    def schedule_last_runs(self) -> dict[str, float]:
        """Per schedule that ran, when its last job was enqueued (Unix seconds)."""
        return {row["name"]: row["last_run"] for row in self._rows("schedule_last_runs")}


def _lock_key(schema: str) -> int:
    return advisory_key("schedule", schema)


def _database_now(
    cur: psycopg.Cursor[dict[str, Any]], sql: Any, rows: Mapping[str, Any]
) -> datetime:
    if rows:
        read: datetime = next(iter(rows.values()))["now"]
        return read
    cur.execute(sql("database_now"))
    now: datetime = one_row(cur)["now"]
    return now


def _next_due(cur: psycopg.Cursor[dict[str, Any]], sql: Any) -> float | None:
    cur.execute(sql("schedule_next_due"))
    seconds = one_row(cur)["seconds"]
    return None if seconds is None else max(0.0, float(seconds))


def _definition_params(schedule: Schedule) -> dict[str, Any]:
    return {
        "name": schedule.name,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "task": schedule.task,
        "queue": schedule.queue,
        "payload": payload_json(schedule.payload),
        "priority": schedule.priority,
        "max_attempts": schedule.max_attempts,
        "source": schedule.source,
    }


__all__ = [
    "ScheduleInfo",
    "ScheduleMethods",
    "ScheduleRound",
    "ScheduledRun",
    "SyncReport",
]


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
