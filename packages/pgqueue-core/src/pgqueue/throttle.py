"""Throttle: how a handler says "the service I call told me to slow down".

A handler raises :class:`Throttle` instead of failing when the service it calls is
over its limit (an HTTP 429 or 503 answer, a quota error). The worker puts the job back
in the queue, runnable after ``seconds``, and the attempt does not count: ``attempts``
goes back to what it was before the claim, so a job throttled any number of times still
has all its attempts (a throttled run leaves no error either). With ``scope``:

- ``"job"``: only this job waits (a snooze);
- ``"partition"``: no worker anywhere starts another job of this queue and partition
  key before then (a job without a key waits alone, as with ``"job"``);
- ``"queue"``: no worker starts any job of this queue before then.

A throttle that already ends later is kept. Throttles show as ``throttled_until`` in
the queue and partition answers of the API and the CLI, and in
``pgqueue_throttled_partitions`` on ``/metrics``. The rate-limited service usually says
how long to wait in its ``Retry-After`` header: :meth:`Throttle.raise_for` turns such an
answer into a throttle in one line::

    response = httpx.post(url, json=job.payload)
    pgqueue.Throttle.raise_for(response, scope="partition")
"""

from __future__ import annotations

import email.utils
import math
from datetime import UTC, datetime
from typing import Any, Protocol

SCOPES = ("job", "partition", "queue")
"""What a throttle holds back: this job, its partition key of its queue, or its queue."""

THROTTLING_STATUSES = frozenset({429, 503})
"""The HTTP answers that :meth:`Throttle.raise_for` takes for "slow down": Too Many
Requests and Service Unavailable."""

MAX_SECONDS = 366 * 24 * 3600.0
"""The longest throttle: a year and a day. A longer Retry-After is cut to it."""


class _Headers(Protocol):
    def get(self, key: str, default: Any = None) -> Any: ...


class HttpResponse(Protocol):
    """What this module reads of an HTTP response: httpx's and requests' both have it."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Any: ...


class Throttle(Exception):
    """Raised by a handler: put the job back, runnable after ``seconds``, without using
    up an attempt; with ``scope`` ``"partition"`` or ``"queue"``, hold back its key or
    its whole queue until then too. See the module's docstring."""

    def __init__(self, seconds: float, scope: str = "job") -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError("Throttle seconds must be a number")
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError("Throttle seconds must be a finite number, 0 or more")
        if scope not in SCOPES:
            raise ValueError(f"Throttle scope must be one of {', '.join(map(repr, SCOPES))}")
        self.seconds = min(float(seconds), MAX_SECONDS)
        self.scope = scope
        super().__init__(f"throttled for {self.seconds:g} s ({scope})")

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its arguments, not from the message: a handler in a process pool
        # raises it in another process.
        return (type(self), (self.seconds, self.scope))

    @classmethod
    def from_response(
        cls, response: HttpResponse, *, scope: str = "job", default: float = 1.0
    ) -> Throttle:
        """A throttle for as long as ``response``'s ``Retry-After`` says (seconds, or an
        HTTP date), or ``default`` seconds when it says nothing readable. ``response``
        is an httpx or a requests response (anything with ``headers``)."""
        seconds = retry_after_seconds(response)
        return cls(default if seconds is None else seconds, scope)

    @classmethod
    def raise_for(cls, response: HttpResponse, *, scope: str = "job", default: float = 1.0) -> None:
        """Raise :meth:`from_response`'s throttle if ``response`` is a 429 or a 503
        answer; do nothing for any other."""
        if response.status_code in THROTTLING_STATUSES:
            raise cls.from_response(response, scope=scope, default=default)


def retry_after_seconds(response: HttpResponse, *, now: datetime | None = None) -> float | None:
    """How many seconds ``response``'s ``Retry-After`` header asks to wait: its delay in
    seconds, or the time until its HTTP date (0 for a date already past), or None when
    it has none or it is not one of those (RFC 9110, section 10.2.3). ``now`` is for a
    caller that knows the time the response was received."""
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    value = str(value).strip()
    if value.isascii() and value.isdigit():
        return min(float(value), MAX_SECONDS)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return min(max(0.0, seconds), MAX_SECONDS)


__all__ = ["SCOPES", "Throttle", "retry_after_seconds"]
