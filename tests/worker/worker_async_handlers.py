"""Coroutine handlers for ``pgqueue worker`` processes in the tests (imported by the
worker from this folder, via ``--handlers worker_async_handlers:GATED``)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

# The handler waits until this file exists: the test opens the gate by creating it.
GATE_VARIABLE = "PGQUEUE_TEST_ASYNC_GATE"


async def wait_at_gate(payload: dict[str, Any]) -> None:
    """Hold a coroutine slot, without a thread, until the test opens the gate."""
    gate = Path(os.environ[GATE_VARIABLE])
    while not gate.exists():
        await asyncio.sleep(0.02)


GATED = {"gated": wait_at_gate}
