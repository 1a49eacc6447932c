"""Handlers passed to ``pgqueue worker --handlers worker_test_handlers:SHOUTING``."""

from __future__ import annotations

from typing import Any


def shout(payload: dict[str, Any]) -> dict[str, Any]:
    """The example plugin's echo, upper-cased: proves which of the two ran."""
    return {key: str(value).upper() for key, value in payload.items()}


SHOUTING = {"echo": shout}
