"""Waiting in a test for what a worker, a server or a thread does.

The timeouts bound a hung test; they measure nothing. They are generous because the
suite runs on loaded machines (``pytest -n``, or a benchmark beside it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    condition: Callable[[], Any],
    timeout: float = 120.0,
    what: str = "",
    interval: float = 0.05,
    *,
    ignoring: tuple[type[BaseException], ...] = (),
) -> Any:
    """Poll ``condition`` every ``interval`` s until it returns something truthy, and
    return that; fail after ``timeout`` s. An exception of a type in ``ignoring``
    counts as "not yet" (a server that does not answer yet, say)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except ignoring:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or condition}")
        time.sleep(interval)
