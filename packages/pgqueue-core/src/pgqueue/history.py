"""The finished jobs' days: creating them ahead, dropping them past their retention.

``finished_jobs`` is partitioned by state, then by UTC day of ``finished_at``
(``finished_jobs_<state>_pYYYYMMDD``, see ``sql/schema.sql``). Days are created a few
ahead, by ``pgqueue migrate``, by every worker whatever its retention (its day maker),
and by ``pgqueue prune``, so a job always finishes into its day; a job no day covers
goes to its state's DEFAULT partition.

Making a day never reads a large DEFAULT partition under a lock that acks wait for.
When a partition is attached, PostgreSQL proves that the DEFAULT partition holds none
of its rows by reading all of it, unless a constraint of the DEFAULT partition proves
it, and meanwhile holds the DEFAULT partition's ACCESS EXCLUSIVE lock (CREATE TABLE ...
PARTITION OF holds the state's table's too): every ack finishing into it would wait for
the read. So a day is first a table of its own, with a constraint saying which rows it
may hold (its *bound*), and is then attached, which reads nothing the constraints
prove, and takes of the state's table only a lock that acks do not wait for:

- beside a small DEFAULT partition (at most SMALL_DEFAULT_BYTES; normally it is empty),
  in one short transaction holding the DEFAULT partition's lock: the day's jobs there,
  if any, move into the day's table, and attaching reads the little that is left;
- beside a large one (days were not made for a while, and jobs finished into DEFAULT),
  in steps: a constraint of the DEFAULT partition refuses the day's rows from then on
  (its *fence*, added NOT VALID, which reads nothing); the day's jobs already there move
  into the day's table in batches of MOVE_BATCH; the fence is validated, which reads the
  DEFAULT partition under a lock that neither acks nor readers wait for; then the day
  is attached, reading nothing, and loses its bound and the DEFAULT partition its fence.
  Until then the day's moved jobs cannot be read (they are of a day to come, so written
  by hand). Only a day that starts at least FENCE_MARGIN from now is made so: its fence
  would refuse the acks of jobs finishing that day. A fence whose day comes closer than
  that without being attached (a round stopped midway) is taken down, and the jobs moved
  out go back. A day that has begun, today when no day was made ahead, is therefore not
  made beside a large DEFAULT partition: its jobs keep finishing into DEFAULT, pruned
  from there row by row, and the days after it are made as usual.

Retention drops whole days: a day goes once its end is older than its state's
retention, so a job is kept for its retention and at most one day more. Dropping a day
leaves no dead rows anywhere, and takes only a moment's lock of the finished table
(given up after two seconds, to be tried again next round, so that acks never queue for
long behind it). The DEFAULT partitions, normally empty, are pruned row by row.

Every step is one short transaction of its own (validating a fence can take as long as
reading the DEFAULT partition does, without holding up anyone); callers that must not
run it twice at once (the pruner) take their lock first, in the same transaction,
through ``guard``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import psycopg
import psycopg.errors
from psycopg import sql

from pgqueue import queries
from pgqueue.job import FINISHED_STATES, JobState

log = logging.getLogger("pgqueue.history")

DAYS_AHEAD = 3
"""Days created ahead of today (today included), so that a day exists before any job
finishes into it even if no day is made for two days."""

SMALL_DEFAULT_BYTES = 1 << 20
"""A DEFAULT partition at most this big (1 MiB) is read whole when a day is attached
beside it, under its lock: a millisecond or so that acks finishing into it wait."""

FENCE_MARGIN = timedelta(hours=1)
"""A day is made beside a large DEFAULT partition only if it starts at least this long
after now, and a fence left on the DEFAULT partition is taken down this long before its
day starts, so that no ack ever finishes into a DEFAULT partition fenced for its day."""

MOVE_BATCH = 1000
"""Jobs moved out of a large DEFAULT partition per transaction."""

_DAY_NAME = re.compile(r"^finished_jobs_(succeeded|dead|cancelled)_p(\d{8})$")
_FENCE_NAME = re.compile(r"^finished_jobs_(succeeded|dead|cancelled)_default_fence_p(\d{8})$")


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
    def default(self) -> str:
        """Its state's DEFAULT partition."""
        return default_partition(self.state)

    @property
    def fence(self) -> str:
        """The constraint that keeps this day's rows out of the DEFAULT partition while
        the day is made beside a large one."""
        return f"{self.default}_fence_p{self.day:%Y%m%d}"

    @property
    def bound(self) -> str:
        """The constraint of the day's table before it is attached: its rows are all of
        its state and day."""
        return f"{self.name}_bound"

    @property
    def start(self) -> datetime:
        """When the day starts."""
        return datetime.combine(self.day, time(), UTC)

    @property
    def end(self) -> datetime:
        """When the day ends: its jobs all finished before this."""
        return datetime.combine(self.day + timedelta(days=1), time(), UTC)

    def create(self, conn: psycopg.Connection, schema: str) -> bool:
        """Make this day's partition in ``schema`` unless it exists (see
        :func:`make_day`)."""
        return make_day(conn, schema, self)

    def _parts(self) -> dict[str, sql.Composable]:
        return {
            "partition": sql.Identifier(self.name),
            "parent": sql.Identifier(self.parent),
            "default": sql.Identifier(self.default),
            "fence": sql.Identifier(self.fence),
            "bound": sql.Identifier(self.bound),
            "state": sql.Literal(self.state.value),
            "start": sql.Literal(self.start),
            "end": sql.Literal(self.end),
        }


def default_partition(state: JobState) -> str:
    """The name of ``state``'s DEFAULT partition."""
    return f"finished_jobs_{state.value}_default"


@dataclass
class DaysMade:
    """What :func:`create_days` did."""

    created: list[str] = field(default_factory=list)
    """The days made, by name."""
    left: dict[str, str] = field(default_factory=dict)
    """The days missing that were not made, by name, and why."""


class DayLeft(Exception):
    """A day that is not made now, and why (see :func:`make_day`)."""


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


def owned(conn: psycopg.Connection, schema: str) -> bool:
    """Whether this session's role may make and drop days: only the owner of the
    finished jobs' tables (or a member of the owner's role) may."""
    with conn.transaction():
        row = conn.execute(queries.bind("history_owned", schema), {"schema": schema}).fetchone()
    return bool(row and row[0])


def create_days(conn: psycopg.Connection, schema: str, guard: Step = _always) -> DaysMade:
    """Make each finished state's days from today to DAYS_AHEAD - 1 days ahead that do
    not exist yet (see :func:`make_day`), first taking down the fences of days that
    were not made in time; say which were made and which were left, and why.

    A day whose locks are busy is left for the next round. Stops early when ``guard``
    refuses a step. Raises InsufficientPrivilege for a role that does not own the
    history (see :func:`owned`) when a day is missing."""
    made = DaysMade()
    if not _take_down_late_fences(conn, schema, guard):
        return made
    existing, today, _ = days(conn, schema)
    have = {(d.state, d.day) for d in existing}
    for offset in range(DAYS_AHEAD):
        for state in FINISHED_STATES:
            day = Day(state, today + timedelta(days=offset))
            if (state, day.day) in have:
                continue
            try:
                if not make_day(conn, schema, day, guard):
                    return made
            except DayLeft as why:
                made.left[day.name] = str(why)
            except psycopg.errors.LockNotAvailable:
                made.left[day.name] = "its locks were busy; it is tried again next round"
            except psycopg.errors.CheckViolation:
                # Attaching found jobs of the day left in DEFAULT: locked while they
                # were moved (by a retry of theirs, say).
                made.left[day.name] = (
                    f"some of its jobs in {day.default} could not be moved yet; it is tried "
                    "again next round"
                )
            else:
                made.created.append(day.name)
    return made


def make_day(conn: psycopg.Connection, schema: str, day: Day, guard: Step = _always) -> bool:
    """Make ``day``'s partition, unless it exists, without reading a large DEFAULT
    partition under a lock that acks wait for (see the module's docstring). The day's
    jobs that finished into the DEFAULT partition move into it.

    Returns True once the day exists, False when ``guard`` refused a step (the steps
    done so far stay done: the next call carries on). Raises :class:`DayLeft` for a day
    that cannot be made so now (it starts within FENCE_MARGIN and its DEFAULT partition
    is large), and LockNotAvailable when its locks stay busy for two seconds."""
    size = _default_bytes(conn, schema, day)
    if size <= SMALL_DEFAULT_BYTES:
        with _step(conn, schema, guard) as go:
            if not go:
                return False
            conn.execute(_statement("history_default_lock", schema, day))
            if _attached(conn, schema, day):
                return True
            # Read again under the lock, which keeps it from growing from here on.
            size = _default_bytes(conn, schema, day)
            if size <= SMALL_DEFAULT_BYTES:
                _attach_beside_small_default(conn, schema, day)
                return True
    now = _database_now(conn, schema)
    if day.start < now + FENCE_MARGIN:
        raise DayLeft(
            f"{day.default} holds {size / (1 << 20):.1f} MiB, too much to read under the "
            f"lock that acks wait for, and the day begins within "
            f"{FENCE_MARGIN.total_seconds() / 3600:g} h (or has begun): its jobs finish "
            f"into {day.default} (pruned from there row by row)"
        )
    return _attach_beside_large_default(conn, schema, day, guard)


def _attach_beside_small_default(conn: psycopg.Connection, schema: str, day: Day) -> None:
    """In the transaction that holds the small DEFAULT partition's lock: its jobs of
    ``day`` move into the day's table, which is attached, reading the DEFAULT partition
    (little) and not the day's table (its bound says what it holds)."""
    conn.execute(_statement("history_day_table", schema, day))
    conn.execute(_statement("history_day_fill", schema, day), {"batch_size": None})
    conn.execute(_statement("history_day_attach", schema, day))
    # A fence left by a round that began beside a large DEFAULT partition.
    conn.execute(_statement("history_fence_drop", schema, day))
    conn.execute(_statement("history_day_unbound", schema, day))
    log.debug("created %s", day.name)


def _attach_beside_large_default(
    conn: psycopg.Connection, schema: str, day: Day, guard: Step
) -> bool:
    """The steps of making ``day`` beside a large DEFAULT partition (see the module's
    docstring); each checks first whether an earlier round got further."""
    with _step(conn, schema, guard) as go:
        if not go:
            return False
        if _attached(conn, schema, day):
            return True
        if _fence(conn, schema, day) is None:
            conn.execute(_statement("history_fence_add", schema, day))
        conn.execute(_statement("history_day_table", schema, day))
    while True:
        with _step(conn, schema, guard) as go:
            if not go:
                return False
            if _attached(conn, schema, day):
                return True
            moved = conn.execute(
                _statement("history_day_fill", schema, day), {"batch_size": MOVE_BATCH}
            )
            if queries.one_row(moved)[0] < MOVE_BATCH:
                break
    with _step(conn, schema, guard) as go:
        if not go:
            return False
        if _attached(conn, schema, day):
            return True
        if not _fenced(conn, schema, day, validated=False):
            try:
                conn.execute(_statement("history_fence_validate", schema, day))
            except psycopg.errors.CheckViolation:
                raise DayLeft(
                    f"some of its jobs in {day.default} were locked while they were moved "
                    "out; it is tried again next round"
                ) from None
    with _step(conn, schema, guard) as go:
        if not go:
            return False
        if _attached(conn, schema, day):
            return True
        # Without its validated fence, attaching would read the DEFAULT partition
        # under its lock.
        _fenced(conn, schema, day, validated=True)
        conn.execute(_statement("history_day_attach", schema, day))
        conn.execute(_statement("history_fence_drop", schema, day))
        conn.execute(_statement("history_day_unbound", schema, day))
    log.debug("created %s beside a large %s", day.name, day.default)
    return True


def _take_down_late_fences(conn: psycopg.Connection, schema: str, guard: Step) -> bool:
    """Take down the fences whose day starts within FENCE_MARGIN (or has begun) and is
    not attached, putting back into the DEFAULT partition the jobs moved out for it;
    False when ``guard`` refused a step."""
    with conn.transaction():
        fences = conn.execute(queries.bind("history_fences", schema), {"schema": schema}).fetchall()
    if not fences:
        return True
    now = _database_now(conn, schema)
    for (name,) in fences:
        match = _FENCE_NAME.match(name)
        if not match:
            continue
        day = Day(JobState(match[1]), datetime.strptime(match[2], "%Y%m%d").date())
        if day.start >= now + FENCE_MARGIN:
            continue  # a day being made: the round making it carries on
        with _step(conn, schema, guard) as go:
            if not go:
                return False
            conn.execute(_statement("history_fence_drop", schema, day))
            if _attached(conn, schema, day) is False:
                conn.execute(_statement("history_day_unstage", schema, day))
                conn.execute(_statement("history_day_drop", schema, day))
        log.warning(
            "%s was not made before it began: its fence on %s is taken down, and its jobs "
            "finish into %s",
            day.name,
            day.default,
            day.default,
        )
    return True


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


def _statement(name: str, schema: str, day: Day) -> sql.Composed:
    return queries.compose(name, schema, "skip-locked", **day._parts())


def _default_bytes(conn: psycopg.Connection, schema: str, day: Day) -> int:
    row = _one(conn, "history_default_size", schema, {"schema": schema, "table": day.default})
    return int(row[0]) if row else 0


def _attached(conn: psycopg.Connection, schema: str, day: Day) -> bool | None:
    """Whether ``day``'s table is a partition; None when there is no such table."""
    row = _one(conn, "history_table", schema, {"schema": schema, "table": day.name})
    return None if row is None else bool(row[0])


def _fence(conn: psycopg.Connection, schema: str, day: Day) -> bool | None:
    """Whether ``day``'s fence is validated; None when there is none."""
    row = _one(conn, "history_fence", schema, {"schema": schema, "fence": day.fence})
    return None if row is None else bool(row[0])


def _fenced(conn: psycopg.Connection, schema: str, day: Day, *, validated: bool) -> bool:
    """Whether ``day``'s fence is validated. Raises DayLeft when the fence is gone
    (taken down as too late, by another process), or not validated when it must be."""
    fence = _fence(conn, schema, day)
    if fence is None or (validated and not fence):
        raise DayLeft(f"its fence on {day.default} was taken down before it was attached")
    return fence


def _database_now(conn: psycopg.Connection, schema: str) -> datetime:
    row = _one(conn, "database_now", schema, None)
    assert row is not None
    now: datetime = row[0]
    return now


def _one(
    conn: psycopg.Connection, name: str, schema: str, params: dict[str, Any] | None
) -> tuple[Any, ...] | None:
    """The first row of a catalog query: in the step's transaction when there is one,
    else in a transaction of its own (never one left open)."""
    statement = queries.bind(name, schema)
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        row: tuple[Any, ...] | None = conn.execute(statement, params).fetchone()
        return row
    with conn.transaction():
        row = conn.execute(statement, params).fetchone()
    return row
