"""Retention, part of :class:`pgqueue.Queue`: pruning finished jobs by hand, and the
automatic pruner's round over the history's daily partitions (:mod:`pgqueue.history`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta

import psycopg
import psycopg.errors
from psycopg import sql

from pgqueue import history, queries, validation
from pgqueue.errors import ValidationError
from pgqueue.job import FINISHED_STATES, JobState
from pgqueue.locks import advisory_key
from pgqueue.queue_base import QueueBase


class PruneMethods(QueueBase):
    """``prune`` and ``prune_expired``: the part of :class:`pgqueue.Queue` that removes
    finished jobs."""

    def prune(
        self,
        older_than: timedelta | float,
        states: Iterable[str | JobState] = FINISHED_STATES,
        *,
        batch_size: int = 1000,
    ) -> int:
        """Delete finished jobs that finished longer ago than ``older_than``, in batches
        of ``batch_size`` (one short transaction each). Returns how many were deleted.
        Their idempotency keys become free again.

        Pruning by hand, to the second: it deletes rows, which vacuum then reclaims. The
        worker's automatic pruning (:meth:`prune_expired`) drops whole days instead."""
        seconds = older_than.total_seconds() if isinstance(older_than, timedelta) else older_than
        validation.seconds("older_than", seconds)
        chosen = [JobState(s) for s in states]
        if any(not s.finished for s in chosen):
            raise ValidationError("states", "only succeeded, dead and cancelled jobs can be pruned")
        statement = queries.compose("job_prune", self.schema, table=sql.Identifier("finished_jobs"))
        params = {
            "states": [s.value for s in chosen],
            "older_than_seconds": seconds,
            "batch_size": batch_size,
        }
        total = 0
        while True:
            with self._connection() as conn:
                deleted: int = queries.one_row(conn.execute(statement, params))[0]
            total += deleted
            if deleted < batch_size:
                return total

    def create_days(self) -> history.DaysMade:
        """Create the coming days of the finished jobs' partitions that do not exist yet,
        from today to two days ahead, and say which were created and which were left
        (see :mod:`pgqueue.history`). A day is never created by reading a large DEFAULT
        partition under a lock that acks wait for: one that has begun beside a large
        DEFAULT partition is left, its jobs finishing into DEFAULT.

        Each step is a short transaction holding the pruner's transaction-scoped
        advisory lock; while another process holds it, this call stops, leaving the rest
        for the next. Needs the role that owns the history (see :meth:`owns_history`):
        raises InsufficientPrivilege otherwise, when a day is missing."""
        with self._connection() as conn:
            return history.create_days(conn, self.schema, self._pruner_turn)

    def owns_history(self) -> bool:
        """Whether this queue's role may create and drop the history's days (it owns the
        finished jobs' tables, or is a member of the role that does)."""
        with self._connection() as conn:
            return history.owned(conn, self.schema)

    def prune_expired(
        self,
        retention: Mapping[str | JobState, timedelta | float],
        *,
        batch_size: int = 500,
        max_batches: int = 100,
        create_days: bool = True,
    ) -> int | None:
        """The automatic pruner's round: create the coming days of the finished jobs'
        partitions (as :meth:`create_days` does; ``create_days=False`` leaves them to
        it), drop the days past their state's retention, and delete the jobs past it
        from the DEFAULT partitions (see :mod:`pgqueue.history`).

        ``retention`` maps finished states to how long after finishing their jobs are
        kept; states left out are kept forever. A job is dropped with its day, so it is
        kept for its retention and at most a day more. Each step (a day created or
        dropped, a batch of at most ``batch_size`` jobs deleted from a DEFAULT
        partition, at most ``max_batches`` of them) is a short transaction of its own
        holding a transaction-scoped advisory lock, so however many processes call this,
        one changes the history at a time, and no lock outlives its transaction (safe
        behind PgBouncer).

        Returns how many jobs were removed, or None when another process held the lock
        before this call removed anything.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValidationError("batch_size", "must be a positive integer")
        if isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 1:
            raise ValidationError("max_batches", "must be a positive integer")
        rules = dict(_retention_rules(retention))
        our_turn = self._pruner_turn
        with self._connection() as conn:
            if create_days:
                history.create_days(conn, self.schema, our_turn)
            dropped = history.drop_expired_days(conn, self.schema, rules, our_turn)
        if dropped is None:
            return None
        total = dropped
        batches = 0
        for state, seconds in rules.items():
            statement = queries.compose(
                "job_prune", self.schema, table=sql.Identifier(history.default_partition(state))
            )
            params = {
                "states": [state.value],
                "older_than_seconds": seconds,
                "batch_size": batch_size,
            }
            while batches < max_batches:
                with self._connection() as conn:
                    if not our_turn(conn):
                        return total or None
                    deleted = conn.execute(statement, params).fetchone()[0]  # type: ignore[index]
                batches += 1
                total += deleted
                if deleted < batch_size:
                    break
        return total

    def _pruner_turn(self, conn: psycopg.Connection) -> bool:
        """Take the pruner's transaction-scoped lock in ``conn``'s transaction, if no one
        holds it: one process changes the history at a time."""
        key = advisory_key("prune", self.schema)
        locked: bool = queries.one_row(conn.execute(self._sql("pruner_try_lock"), {"key": key}))[0]
        return locked


def _retention_rules(
    retention: Mapping[str | JobState, timedelta | float],
) -> list[tuple[JobState, float]]:
    """(state, seconds kept after finishing) per state in ``retention``, checked."""
    rules: list[tuple[JobState, float]] = []
    for state, kept in retention.items():
        try:
            chosen = JobState(state)
        except ValueError:
            raise ValidationError("retention", f"{state!r} is not a job state") from None
        if not chosen.finished:
            raise ValidationError(
                "retention", "only succeeded, dead and cancelled jobs can be pruned"
            )
        seconds = kept.total_seconds() if isinstance(kept, timedelta) else kept
        rules.append((chosen, validation.seconds("retention", seconds)))
    return rules
