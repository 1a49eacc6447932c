"""Retry delays: exponential, capped, half fixed and half random.

The one place a retry's delay is worked out: ``Queue.finish_many`` sends each failed
attempt's delay with it, and the reaper finishes expired leases through the same
call, so jobs whose worker died back off exactly like jobs whose handler raised.
"""

from __future__ import annotations

import random
from collections.abc import Callable

DEFAULT_BASE_SECONDS = 1.0
DEFAULT_CAP_SECONDS = 3600.0

# 2**62 seconds is already far past any cap; clamping the exponent keeps huge attempt
# counts from overflowing a float.
_MAX_EXPONENT = 62


def backoff_ceiling(attempt: int, base: float, cap: float) -> float:
    """The full delay before jitter for the retry after failed ``attempt`` (1-based)."""
    exponent = min(max(attempt, 1) - 1, _MAX_EXPONENT)
    return min(cap, base * 2.0**exponent)


def backoff_seconds(
    attempt: int,
    base: float = DEFAULT_BASE_SECONDS,
    cap: float = DEFAULT_CAP_SECONDS,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before retrying after failed ``attempt``.

    ``min(cap, base * 2**(attempt-1))``, of which half is fixed and half random, so a
    burst of failures spreads out instead of retrying in lockstep.
    """
    ceiling = backoff_ceiling(attempt, base, cap)
    return ceiling / 2 + rand() * ceiling / 2
