"""Task handlers for the worker processes of the fleet test."""

from __future__ import annotations

from typing import Any


def echo(payload: dict[str, Any]) -> dict[str, Any]:
    """Return the payload as the result."""
    return payload


HANDLERS = {"echo": echo}
