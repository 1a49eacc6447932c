"""The finished jobs' days: creating them ahead, dropping them past their retention.

``finished_jobs`` is partitioned by state, then by UTC day of ``finished_at``
(``finished_jobs_<state>_pYYYYMMDD``, see ``sql/schema.sql``). Days are created a few
ahead, by ``pgqueue migrate`` and by every round of a worker's pruner, so a job always
finishes into its day; a job no day covers goes to its state's DEFAULT partition.

Retention drops whole days: a day goes once its end is older than its state's
retention, so a job is kept for its retention and at most one day more. Dropping a day
leaves no dead rows anywhere, and takes only a moment's lock of the finished table
(given up after two seconds, to be tried again next round, so that acks never queue for
long behind it). The DEFAULT partitions, normally empty, are pruned row by row.

Every step is one short transaction of its own; callers that must not run it twice at
once (the pruner) take their lock first, in the same transaction, through ``step``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

import psycopg
import psycopg.errors
from psycopg import sql

from pgqueue import queries
from pgqueue.job import FINISHED_STATES, JobState

log = logging.getLogger("pgqueue.history")

DAYS_AHEAD = 3
"""Days created ahead of today (today included), so that a day exists before any job
finishes into it even if no pruner runs for two days."""

_DAY_NAME = re.compile(r"^finished_jobs_(succeeded|dead|cancelled)_p(\d{8})$")


@dataclass(frozen=True)
class Day:
    """One day's partition of one finished state."""

    state: JobState
    day: date

    @property
    def name(self) -> str:
        return f"finished_jobs_{self.state.value}_p{self.day:%Y%m%d}"

    @property
    def parent(self) -> str:
        return f"finished_jobs_{self.state.value}"

    @property
    def end(self) -> datetime:
        """When the day ends: its jobs all finished before this."""
        return datetime.combine(self.day + timedelta(days=1), time(), UTC)

    def create(self, conn: psycopg.Connection, schema: str) -> None:
        """Create this day's partition in ``schema`` unless it exists (see
        ``history_day_create``)."""
        conn.execute(
            queries.compose(
                "history_day_create",
                schema,
                partition=sql.Identifier(self.name),
                parent=sql.Identifier(self.parent),
                start=sql.Literal(self.end - timedelta(days=1)),
                end=sql.Literal(self.end),
            )
        )


def default_partition(state: JobState) -> str:
    """The name of ``state``'s DEFAULT partition."""
    return f"finished_jobs_{state.value}_default"


Step = Callable[[psycopg.Connection], bool]
"""What a caller runs before each step, in the step's transaction: False skips it (the
pruner takes its advisory lock here)."""


def _always(conn: psycopg.Connection) -> bool:
    return True


@contextmanager
def _step(conn: psycopg.Connection, schema: str, guard: Step) -> Iterator[bool]:
    """One transaction for one step: with the lock timeout set, and after ``guard``."""
    with conn.transaction():
        conn.execute(queries.bind("history_step_lock", schema))
        yield guard(conn)


def days(conn: psycopg.Connection, schema: str) -> tuple[list[Day], date, datetime]:
    """The day partitions that exist, today's UTC date and the time now, on the
    database clock."""
    with conn.transaction():
        rows = conn.execute(queries.bind("history_days", schema), {"schema": schema}).fetchall()
        now = conn.execute(queries.bind("database_now", schema)).fetchone()[0]  # type: ignore[index]
    found = []
    for name, _parent in rows:
        match = _DAY_NAME.match(name)
        if match:
            found.append(Day(JobState(match[1]), datetime.strptime(match[2], "%Y%m%d").date()))
    return found, now.astimezone(UTC).date(), now


def create_days(conn: psycopg.Connection, schema: str, guard: Step = _always) -> int:
    """Create each finished state's days from today to DAYS_AHEAD - 1 days ahead that do
    not exist yet; return how many were created.

    A day whose rows already sit in the DEFAULT partition (no day existed when they
    finished) is not created: its rows stay there, pruned row by row, and a warning
    says so. A day that cannot get its locks in time is left for the next round."""
    existing, today, _ = days(conn, schema)
    have = {(d.state, d.day) for d in existing}
    created = 0
    for offset in range(DAYS_AHEAD):
        for state in FINISHED_STATES:
            day = Day(state, today + timedelta(days=offset))
            if (state, day.day) in have:
                continue
            try:
                with _step(conn, schema, guard) as go:
                    if not go:
                        return created
                    day.create(conn, schema)
                created += 1
            except (psycopg.errors.DuplicateTable, psycopg.errors.UniqueViolation):
                pass  # another process created it between our look and our try
            except psycopg.errors.CheckViolation:
                log.warning(
                    "%s not created: jobs of that day are in %s already (they are pruned "
                    "from there row by row)",
                    day.name,
                    default_partition(state),
                )
            except psycopg.errors.LockNotAvailable:
                log.info("%s not created this round: its locks were busy", day.name)
    return created


def drop_expired_days(
    conn: psycopg.Connection,
    schema: str,
    retention: Mapping[JobState, float],
    guard: Step = _always,
) -> int | None:
    """Drop every day whose end is older than its state's retention in seconds (states
    left out are kept forever); return how many jobs went with them, or None when
    ``guard`` refused the first step."""
    existing, _, now = days(conn, schema)
    removed = 0
    for day in existing:
        kept = retention.get(day.state)
        if kept is None or day.end > now - timedelta(seconds=kept):
            continue
        try:
            with _step(conn, schema, guard) as go:
                if not go:
                    return None if removed == 0 else removed
                partition = sql.Identifier(day.name)
                conn.execute(queries.compose("history_day_lock", schema, partition=partition))
                released = conn.execute(
                    queries.compose("history_day_release", schema, partition=partition)
                )
                jobs = queries.one_row(released)[0]
                conn.execute(queries.compose("history_day_drop", schema, partition=partition))
            removed += jobs
            log.info("dropped %s (%d jobs past their retention)", day.name, jobs)
        except psycopg.errors.LockNotAvailable:
            log.info("%s not dropped this round: its locks were busy", day.name)
    return removed
