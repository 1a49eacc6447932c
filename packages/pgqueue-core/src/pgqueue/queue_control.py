"""Queues as objects an operator steers: pause and resume, and limits that hold across
every worker.

A queue's settings live in ``queue_settings`` (one row per configured queue) and are
read by every claim (see ``job_claim`` in ``sql/queries.sql``), so a change holds from
the next claim of every worker on:

- ``paused``: claims take no job from the queue; enqueues still land. Jobs a worker
  claimed before the pause still run (a worker claims ahead only what its slots start
  within about 0.1 s). Resuming notifies the queue's waiting workers at once.
- ``concurrency_limit``: jobs claimed and not finished, across every worker, at most.
  Jobs claimed ahead of a free slot count as running.
- ``rate_limit``: jobs claimed per second, across every worker: a token bucket that
  refills at that rate and holds at most a tenth of a second's worth (at least one
  job), so a burst after an idle spell is that large at most.

:class:`QueueControlMethods` is part of :class:`pgqueue.Queue`.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
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

    def to_dict(self) -> dict[str, Any]:
        """As plain data."""
        return dict(self.__dict__)


def check_paused(value: object) -> bool:
    """``paused`` must be a bool."""
    if not isinstance(value, bool):
        raise ValidationError("paused", "must be true or false")
    return value


def check_concurrency_limit(value: object) -> int | None:
    """None, or a whole number of jobs, 0 or more (0 starts nothing, like a pause)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError("concurrency_limit", "must be a whole number of jobs, or null")
    if value < 0:
        raise ValidationError("concurrency_limit", "must not be negative")
    if value > CONCURRENCY_LIMIT_MAX:
        raise ValidationError("concurrency_limit", f"must be at most {CONCURRENCY_LIMIT_MAX}")
    return value


def check_rate_limit(value: object) -> float | None:
    """None, or a finite number of jobs per second greater than 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValidationError("rate_limit", "must be a number of jobs per second, or null")
    if not math.isfinite(value):
        raise ValidationError("rate_limit", "must be finite")
    if value <= 0:
        raise ValidationError("rate_limit", "must be greater than 0 (pause the queue instead)")
    if value > RATE_LIMIT_MAX:
        raise ValidationError("rate_limit", f"must be at most {RATE_LIMIT_MAX:g} jobs per second")
    return float(value)


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
    ) -> QueueInfo:
        """Change the settings given of queue ``name`` (None: no limit) and return all of
        them. Every claim from then on follows them. A queue left unpaused wakes its
        waiting workers at once.

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
        }
        rows = self._rows("queue_update", params)
        if not rows:
            raise QueueNotFound(name)
        row = rows[0]
        return QueueInfo(
            queue=row["queue"],
            paused=row["paused"],
            concurrency_limit=row["concurrency_limit"],
            rate_limit=row["rate_limit"],
        )

    def pause_queue(self, name: str, *, create: bool = False) -> QueueInfo:
        """Stop workers from starting jobs of queue ``name`` (enqueues still land); jobs
        already claimed finish. See :meth:`update_queue`."""
        return self.update_queue(name, paused=True, create=create)

    def resume_queue(self, name: str) -> QueueInfo:
        """Let workers start jobs of queue ``name`` again, waking the waiting ones at
        once. See :meth:`update_queue`."""
        return self.update_queue(name, paused=False)


__all__ = [
    "UNSET",
    "QueueControlMethods",
    "QueueInfo",
    "check_concurrency_limit",
    "check_paused",
    "check_rate_limit",
]
