"""Task handlers for the worker processes of the PgBouncer tests."""

from __future__ import annotations

from typing import Any


def echo(payload: dict[str, Any]) -> dict[str, Any]:
    """Return the payload as the result."""
    return payload


def fail(payload: dict[str, Any]) -> None:
    """Always fail."""
    raise RuntimeError("this task always fails")


HANDLERS = {"echo": echo, "fail": fail}
