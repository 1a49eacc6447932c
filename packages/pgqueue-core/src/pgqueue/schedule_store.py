"""Schedules in the database: the scheduler's round, and the operator's view and switch.
The workers' sync, which writes the rows from the plugins' declarations, is
:mod:`pgqueue.schedule_sync`.

Rows live in the ``schedules`` table (see ``sql/schema.sql``), so every worker, the
API and the CLI see the same state.

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

A row the round cannot evaluate (see :func:`pgqueue.schedules.row_problem`: a time zone
or cron expression this version does not read, a payload it cannot decode) is skipped:
the reason goes in its ``error`` column, shown by ``pgqueue schedules``, the API and the
dashboard, and in one log line (again only if the reason changes), and it is looked at
again ``SKIPPED_RETRY_SECONDS`` later, when a worker that can read it, or a fixed row,
makes it run from its next tick. The other schedules run as usual.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import psycopg

from pgqueue import jsonb
from pgqueue.errors import IdempotencyConflict, ValidationError, error_line
from pgqueue.job_spec import JobSpec
from pgqueue.locks import advisory_key
from pgqueue.queries import one_row
from pgqueue.schedules import (
    ScheduleError,
    ScheduleInfo,
    ScheduleNotFound,
    next_tick,
    row_problem,
    tick_key,
    ticks,
)
from pgqueue.settings import DEFAULT_MAX_ATTEMPTS

log = logging.getLogger("pgqueue.schedules")

MISSED_TICKS_COUNTED = 1000
"""After downtime, missed ticks are counted (for the log) up to this many."""
SKIPPED_RETRY_SECONDS = 60.0
"""How long a round leaves a schedule row it cannot evaluate before it looks again:
long enough to cost nothing, short enough for a worker of another version (or a fixed
row) to take it up soon."""


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
        run is its first tick from now. Raises :class:`ScheduleNotFound`, and
        :class:`~pgqueue.schedules.ScheduleError` for one whose time zone or cron
        expression this version cannot read (it stays as it was)."""
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
                # A skipped row's next_run_at is when the scheduler looks again, no tick:
                # enabled by an operator whose pgqueue reads it, it starts afresh.
                keep = row["enabled"] and row["error"] is None
                next_run_at = row["next_run_at"] if keep else None
                if next_run_at is None:
                    try:
                        next_run_at = next_tick(row["cron"], row["timezone"], row["now"])
                    except ScheduleError as exc:
                        raise ScheduleError(f"schedule {name!r} cannot run: {exc}") from None
            cur.execute(
                self._sql("schedule_set_enabled"),
                {"name": name, "enabled": enabled, "next_run_at": next_run_at},
            )
            info = ScheduleInfo.from_row(one_row(cur))
        log.info("schedule %s %s by the operator", name, "enabled" if enabled else "disabled")
        return info

    # -- the scheduler's round --------------------------------------------------------

    def run_due_schedules(self) -> ScheduleRound:
        """One scheduler round: if no other process is in one, enqueue a job for each
        enabled schedule whose tick has come and move it to its next tick, all in one
        transaction; see the module's documentation."""
        with self._connection() as conn:
            cur = jsonb.cursor(conn)
            cur.execute(self._sql("scheduler_try_lock"), {"key": schedule_lock_key(self.schema)})
            if not one_row(cur)["locked"]:
                return ScheduleRound(False, [], _next_due(cur, self._sql))
            cur.execute(self._sql("schedules_due"))
            due = cur.fetchall()
            runs: list[ScheduledRun] = []
            moved: list[_Moved] = []
            for row in due:
                try:
                    plan = _plan(row)
                except Exception as exc:
                    # Computing alone (no database): whatever fails is the row's
                    # problem, never the round's.
                    moved.append(_skipped(row, exc))
                    continue
                if row["error"] is not None:
                    log.info(
                        "schedule %s can run again: next run %s",
                        row["name"],
                        plan.following.isoformat(),
                    )
                run = None if plan.tick is None else self._run_one(conn, row, plan)
                if run is not None:
                    runs.append(run)
                moved.append(
                    _Moved(
                        row["name"],
                        plan.following,
                        row["now"] if run is not None and run.job_id is not None else None,
                        run.tick if run is not None else None,
                        run.job_id if run is not None else None,
                    )
                )
            if moved:
                cur.execute(
                    self._sql("schedules_ran"),
                    {
                        "names": [m.name for m in moved],
                        "next_run_ats": [m.next_run_at for m in moved],
                        "run_ats": [m.run_at for m in moved],
                        "tick_ats": [m.tick_at for m in moved],
                        "job_ids": [m.job_id for m in moved],
                        "errors": [m.error for m in moved],
                    },
                )
            return ScheduleRound(True, runs, _next_due(cur, self._sql))

    def _run_one(
        self, conn: psycopg.Connection, row: Mapping[str, Any], plan: _Plan
    ) -> ScheduledRun:
        """The run of the due schedule ``row``'s tick, as ``plan`` says, enqueued on
        ``conn``."""
        name, tick, missed = row["name"], plan.tick, plan.missed
        assert tick is not None
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
            return ScheduledRun(name, tick, None, False)
        except ValidationError as exc:
            log.error("schedule %s: tick %s enqueued nothing: %s", name, tick, exc)
            return ScheduledRun(name, tick, None, False)
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
        return ScheduledRun(name, tick, job.id, result.created)

    # -- metrics ----------------------------------------------------------------------

    def schedule_last_runs(self) -> dict[str, float]:
        """Per schedule that ran, when its last job was enqueued (Unix seconds)."""
        return {row["name"]: row["last_run"] for row in self._rows("schedule_last_runs")}


@dataclass(frozen=True)
class _Plan:
    """What a round does with one due schedule: run ``tick`` (None: only fill in its
    next tick), then wait for ``following``."""

    tick: datetime | None
    following: datetime
    missed: int = 0
    """Ticks after ``tick`` that came while no scheduler ran (they make no run)."""


class _Moved(NamedTuple):
    """One row of ``schedules_ran``."""

    name: str
    next_run_at: datetime
    run_at: datetime | None
    tick_at: datetime | None
    job_id: int | None
    error: str | None = None


def _plan(row: Mapping[str, Any]) -> _Plan:
    """The plan for the due schedule ``row``; raises (ScheduleError, or whatever
    croniter raises) when the row cannot be evaluated. Computes only: no database."""
    problem = row_problem(row)
    if problem is not None:
        raise ScheduleError(problem)
    cron, timezone, now = row["cron"], row["timezone"], row["now"]
    tick = row["next_run_at"]
    if tick is None or row["error"] is not None:
        # New, or skipped until now: its next_run_at was no tick of its own. It starts
        # from its next tick, without a run for the time it was skipped.
        return _Plan(None, next_tick(cron, timezone, now))
    for missed, moment in enumerate(ticks(cron, timezone, tick)):
        if moment > now:
            return _Plan(tick, moment, missed)
        if missed + 1 >= MISSED_TICKS_COUNTED:
            return _Plan(tick, next_tick(cron, timezone, now), missed + 1)
    raise AssertionError("ticks() is endless")  # pragma: no cover


def _skipped(row: Mapping[str, Any], exc: Exception) -> _Moved:
    """The due schedule ``row``, which could not be evaluated (``exc`` says why),
    skipped until SKIPPED_RETRY_SECONDS from now; logged once per reason."""
    reason = str(exc) if isinstance(exc, ScheduleError) else error_line(exc)
    if reason != row["error"]:
        log.error(
            "schedule %s skipped: %s (the other schedules run; looked at again every %g s, "
            "see its error in pgqueue schedules)",
            row["name"],
            reason,
            SKIPPED_RETRY_SECONDS,
        )
    retry_at = row["now"] + timedelta(seconds=SKIPPED_RETRY_SECONDS)
    return _Moved(row["name"], retry_at, None, None, None, reason)


def schedule_lock_key(schema: str) -> int:
    """The advisory lock of a scheduler round, which a sync that changes rows also takes."""
    return advisory_key("schedule", schema)


def _next_due(cur: psycopg.Cursor[dict[str, Any]], sql: Any) -> float | None:
    cur.execute(sql("schedule_next_due"))
    seconds = one_row(cur)["seconds"]
    return None if seconds is None else max(0.0, float(seconds))


__all__ = [
    "ScheduleInfo",
    "ScheduleMethods",
    "ScheduleRound",
    "ScheduledRun",
]
