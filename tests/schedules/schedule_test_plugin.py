"""A pgqueue plugin for the schedule tests, loaded with ``pgqueue worker --plugin``.

Its one task, ``tick``, returns its payload. What it declares comes from the
environment, so one module serves every case:

- ``PGQUEUE_TEST_SCHEDULES``: ``name=cron`` pairs, comma-separated, each a schedule of
  ``tick`` (empty: none);
- ``PGQUEUE_TEST_SCHEDULE_TIMEZONE``: their time zone (default UTC);
- ``PGQUEUE_TEST_SCHEDULE_DUPLICATE=1``: declares the first one twice.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from pgqueue import hookimpl


def tick(payload: dict[str, Any]) -> dict[str, Any]:
    """Return the payload."""
    return payload


@hookimpl
def register_tasks(register: Callable[..., None]) -> None:
    register("tick", tick)


@hookimpl
def register_schedules(register: Callable[..., None]) -> None:
    pairs = [p for p in os.environ.get("PGQUEUE_TEST_SCHEDULES", "").split(",") if p]
    timezone = os.environ.get("PGQUEUE_TEST_SCHEDULE_TIMEZONE", "UTC")
    for pair in pairs:
        name, cron = pair.split("=", 1)
        register(name, cron, "tick", payload={"schedule": name}, timezone=timezone)
    if pairs and os.environ.get("PGQUEUE_TEST_SCHEDULE_DUPLICATE") == "1":
        name, cron = pairs[0].split("=", 1)
        register(name, cron, "tick")
