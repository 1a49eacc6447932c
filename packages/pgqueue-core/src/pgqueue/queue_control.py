"""Queues as objects an operator steers: pause and resume, and limits that hold across
every worker.

A queue's settings live in ``queue_settings`` (one row per configured queue) and are
read by every claim (see ``job_claim`` in ``sql/statements/claiming.sql``), so a change holds from
the next claim of every worker on:

- ``paused``: claims take no job from the queue; enqueues still land. Jobs a worker
  claimed before the pause still run (a worker claims ahead only what its slots start
  within about 0.1 s). Resuming notifies the queue's waiting workers at once.
- ``concurrency_limit``: jobs claimed and not finished, across every worker, at most.
  Jobs claimed ahead of a free slot count as running.
- ``rate_limit``: jobs claimed per second, across every worker: a token bucket that
  refills at that rate and holds at most a tenth of a second's worth (at least one
  job), so a burst after an idle spell is that large at most.
- ``partition_concurrency_limit`` and ``partition_rate_limit``: the same two limits
  for the jobs of each partition key of the queue, apart (jobs without a key are bound
  by the queue-wide limits only).
- a throttle (:meth:`QueueControlMethods.throttle`, or a handler's
  :class:`~pgqueue.throttle.Throttle`): no job of the queue, or of one of its keys,
  starts before it ends.

The keys of a queue, busiest first, with their queued and running jobs and throttles:
:meth:`QueueControlMethods.partitions`.

:class:`QueueControlMethods` is part of :class:`pgqueue.Queue`.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pgqueue import validation
from pgqueue.errors import QueueNotFound, ValidationError

CONCURRENCY_LIMIT_MAX = 2**31 - 1
RATE_LIMIT_MAX = 1_000_000.0
"""Jobs per second, at most: far beyond what one database claims."""


class _Unset(enum.Enum):
    UNSET = "unset"

    def __repr__(self) -> str:
        return "UNSET"


UNSET = _Unset.UNSET
"""The value of a setting :meth:`QueueControlMethods.update_queue` leaves as it is."""


@dataclass(frozen=True)
class QueueInfo:
    """A queue's settings."""

    queue: str
    paused: bool
    concurrency_limit: int | None
    """Jobs running at once across every worker, at most; None: no limit."""
    rate_limit: float | None
    """Jobs started per second across every worker, at most; None: no limit."""
    partition_concurrency_limit: int | None = None
    """Jobs of one partition key running at once across every worker, at most."""
    partition_rate_limit: float | None = None
    """Jobs of one partition key started per second across every worker, at most."""
    throttled_until: datetime | None = None
    """No job of the queue starts before this time (None: no throttle holds)."""

    def to_dict(self) -> dict[str, Any]:
        """As plain data (the throttle's end as ISO 8601 text)."""
        out = dict(self.__dict__)
        if self.throttled_until is not None:
            out["throttled_until"] = self.throttled_until.isoformat()
        return out


@dataclass(frozen=True)
class PartitionInfo:
    """One partition key of a queue, as :meth:`QueueControlMethods.partitions` lists it."""

    partition_key: str
    queued: int
    running: int
    throttled_until: datetime | None
    """No job of this key starts before this time (None: no throttle holds)."""

    def to_dict(self) -> dict[str, Any]:
        """As plain data (the throttle's end as ISO 8601 text)."""
        out = dict(self.__dict__)
        if self.throttled_until is not None:
            out["throttled_until"] = self.throttled_until.isoformat()
        return out


@dataclass(frozen=True)
class PartitionPage:
    """A page of a queue's partition keys, and the cursor of the next page (None on
    the last)."""

    partitions: list[PartitionInfo]
    next_after: str | None


PARTITIONS_PAGE_MAX = 1000
"""The most keys one page of :meth:`QueueControlMethods.partitions` lists."""


def check_paused(value: object) -> bool:
    """``paused`` must be a bool."""
    if not isinstance(value, bool):
        raise ValidationError("paused", "must be true or false")
    return value


def check_concurrency_limit(value: object, field: str = "concurrency_limit") -> int | None:
    """None, or a whole number of jobs, 0 or more (0 starts nothing, like a pause)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(field, "must be a whole number of jobs, or null")
    if value < 0:
        raise ValidationError(field, "must not be negative")
    if value > CONCURRENCY_LIMIT_MAX:
        raise ValidationError(field, f"must be at most {CONCURRENCY_LIMIT_MAX}")
    return value


def check_rate_limit(value: object, field: str = "rate_limit") -> float | None:
    """None, or a finite number of jobs per second greater than 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValidationError(field, "must be a number of jobs per second, or null")
    if not math.isfinite(value):
        raise ValidationError(field, "must be finite")
    if value <= 0:
        raise ValidationError(field, "must be greater than 0 (pause the queue instead)")
    if value > RATE_LIMIT_MAX:
        raise ValidationError(field, f"must be at most {RATE_LIMIT_MAX:g} jobs per second")
    return float(value)


def check_partition_concurrency_limit(value: object) -> int | None:
    """None, or a whole number of jobs of one key, 0 or more."""
    return check_concurrency_limit(value, "partition_concurrency_limit")


def check_partition_rate_limit(value: object) -> float | None:
    """None, or a finite number of jobs of one key per second greater than 0."""
    return check_rate_limit(value, "partition_rate_limit")


THROTTLE_MAX_SECONDS = 366 * 24 * 3600.0
"""The longest throttle: a year and a day (a longer one is a pause)."""


def check_throttle_seconds(value: object, field: str = "seconds") -> float:
    """A throttle's length: a finite number of seconds, 0 (ends a throttle) to a year."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValidationError(field, "must be a number of seconds")
    if not math.isfinite(value) or value < 0:
        raise ValidationError(field, "must be a finite number of seconds, 0 or more")
    if value > THROTTLE_MAX_SECONDS:
        raise ValidationError(field, "must be at most a year (pause the queue instead)")
    return float(value)


def _partitions_cursor(row: dict[str, Any]) -> str:
    """The cursor of the page after ``row``: where it stands in the order (busy, key),
    as URL-safe text."""
    place = json.dumps([row["queued"] + row["running"], row["partition_key"]])
    return base64.urlsafe_b64encode(place.encode()).decode().rstrip("=")


def _partitions_after(cursor: str) -> tuple[int, str]:
    """The (busy, key) a cursor of :func:`_partitions_cursor` stands for."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        busy, key = json.loads(text)
    except (binascii.Error, UnicodeDecodeError, ValueError, TypeError):
        raise ValidationError("after", "is not a cursor this listing gave") from None
    if isinstance(busy, bool) or not isinstance(busy, int) or not isinstance(key, str):
        raise ValidationError("after", "is not a cursor this listing gave")
    return busy, key


class QueueControlMethods:
    """The operator's part of :class:`pgqueue.Queue` (which provides ``_rows``)."""

    _rows: Any

    def update_queue(
        self,
        name: str,
        *,
        paused: bool | _Unset = UNSET,
        concurrency_limit: int | _Unset | None = UNSET,
        rate_limit: float | _Unset | None = UNSET,
        create: bool = False,
        partition_concurrency_limit: int | _Unset | None = UNSET,
        partition_rate_limit: float | _Unset | None = UNSET,
    ) -> QueueInfo:
        """Change the settings given of queue ``name`` (None: no limit) and return all of
        them. Every claim from then on follows them. A queue left unpaused wakes its
        waiting workers at once. ``partition_concurrency_limit`` and
        ``partition_rate_limit`` hold for the jobs of each partition key apart.

        Raises :class:`~pgqueue.errors.QueueNotFound` for a queue that never had a job
        nor settings, unless ``create`` (to configure a queue before its first job),
        and :class:`~pgqueue.errors.ValidationError` for a bad value."""
        validation.name("queue", name)
        params = {
            "queue": name,
            "create": bool(create),
            "set_paused": paused is not UNSET,
            "paused": None if paused is UNSET else check_paused(paused),
            "set_concurrency_limit": concurrency_limit is not UNSET,
            "concurrency_limit": None
            if concurrency_limit is UNSET
            else check_concurrency_limit(concurrency_limit),
            "set_rate_limit": rate_limit is not UNSET,
            "rate_limit": None if rate_limit is UNSET else check_rate_limit(rate_limit),
            "set_partition_concurrency_limit": partition_concurrency_limit is not UNSET,
            "partition_concurrency_limit": None
            if partition_concurrency_limit is UNSET
            else check_partition_concurrency_limit(partition_concurrency_limit),
            "set_partition_rate_limit": partition_rate_limit is not UNSET,
            "partition_rate_limit": None
            if partition_rate_limit is UNSET
            else check_partition_rate_limit(partition_rate_limit),
        }
        rows = self._rows("queue_update", params)
        if not rows:
            raise QueueNotFound(name)
        return queue_info(rows[0])

    def throttle(self, name: str, seconds: float, *, partition_key: str | None = None) -> datetime:
        """Start no job of queue ``name`` (or, with ``partition_key``, of that key of the
        queue) for ``seconds`` from now, on every worker: what a handler's
        :class:`~pgqueue.throttle.Throttle` with scope ``"queue"`` or ``"partition"``
        does. A throttle that already ends later is kept; ``seconds=0`` ends one now.
        Returns when the throttle ends."""
        validation.name("queue", name)
        seconds = check_throttle_seconds(seconds)
        if partition_key is not None:
            validation.partition_key(partition_key)
        rows = self._rows(
            "throttle_set", {"queue": name, "seconds": seconds, "partition_key": partition_key}
        )
        ends: datetime = rows[0]["throttled_until"]
        return ends

    def partitions(self, name: str, *, limit: int = 100, after: str | None = None) -> PartitionPage:
        """Queue ``name``'s partition keys, busiest first (running plus queued jobs, then
        key), each with its queued and running jobs and the end of its throttle; keys
        that only a throttle names are listed too. ``after`` is the previous page's
        ``next_after``. Reads the queue's queued and running jobs with a key (an
        operator's call: it grows with the backlog)."""
        validation.name("queue", name)
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise ValidationError(
                "limit", f"must be a whole number from 1 to {PARTITIONS_PAGE_MAX}"
            )
        if not 1 <= limit <= PARTITIONS_PAGE_MAX:
            raise ValidationError("limit", f"must be between 1 and {PARTITIONS_PAGE_MAX}")
        after_busy, after_key = _partitions_after(after) if after is not None else (None, None)
        rows = self._rows(
            "partitions_list",
            {"queue": name, "limit": limit + 1, "after_busy": after_busy, "after_key": after_key},
        )
        page = [PartitionInfo(**row) for row in rows[:limit]]
        return PartitionPage(
            partitions=page,
            next_after=_partitions_cursor(rows[limit - 1]) if len(rows) > limit else None,
        )

    def throttled_partitions(self) -> dict[str, int]:
        """Per queue, how many of its partition keys are throttled now (queues with none
        are left out)."""
        return {row["queue"]: row["keys"] for row in self._rows("throttled_partitions", {})}

    def pause_queue(self, name: str, *, create: bool = False) -> QueueInfo:
        """Stop workers from starting jobs of queue ``name`` (enqueues still land); jobs
        already claimed finish. See :meth:`update_queue`."""
        return self.update_queue(name, paused=True, create=create)

    def resume_queue(self, name: str) -> QueueInfo:
        """Let workers start jobs of queue ``name`` again, waking the waiting ones at
        once. See :meth:`update_queue`."""
        return self.update_queue(name, paused=False)


def queue_info(row: dict[str, Any]) -> QueueInfo:
    """A queue's settings from a row of queue_update (or any row with those columns)."""
    return QueueInfo(
        queue=row["queue"],
        paused=row["paused"],
        concurrency_limit=row["concurrency_limit"],
        rate_limit=row["rate_limit"],
        partition_concurrency_limit=row["partition_concurrency_limit"],
        partition_rate_limit=row["partition_rate_limit"],
        throttled_until=row["throttled_until"],
    )


__all__ = [
    "UNSET",
    "PartitionInfo",
    "PartitionPage",
    "QueueControlMethods",
    "QueueInfo",
    "check_concurrency_limit",
    "check_partition_concurrency_limit",
    "check_partition_rate_limit",
    "check_paused",
    "check_rate_limit",
    "check_throttle_seconds",
]
