"""Handlers passed to ``pgqueue worker --handlers worker_test_handlers:SHOUTING``."""

from __future__ import annotations

import gc
from typing import Any


def shout(payload: dict[str, Any]) -> dict[str, Any]:
    """The example plugin's echo, upper-cased: proves which of the two ran."""
    return {key: str(value).upper() for key, value in payload.items()}


def garbage_collector(payload: dict[str, Any]) -> dict[str, Any]:
    """How the worker process set up the garbage collector before running jobs."""
    return {"young_threshold": gc.get_threshold()[0], "frozen": gc.get_freeze_count()}


SHOUTING = {"echo": shout}
INTROSPECTING = {"garbage_collector": garbage_collector}
