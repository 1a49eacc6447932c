"""Task handlers for the worker processes of the scale tests."""

from __future__ import annotations

import time
from typing import Any


def echo(payload: dict[str, Any]) -> dict[str, Any]:
    """Return the payload as the result."""
    return payload


def nap(payload: dict[str, Any]) -> None:
    """Sleep ``seconds``: workers that keep acking for a while."""
    time.sleep(payload["seconds"])


HANDLERS = {"echo": echo, "nap": nap}
