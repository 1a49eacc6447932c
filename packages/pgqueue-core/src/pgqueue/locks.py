"""Advisory-lock keys, one per purpose and schema, so two schemas never block each other."""

from __future__ import annotations

import hashlib


def advisory_key(purpose: str, schema: str) -> int:
    """A stable signed 64-bit key for ``purpose`` (``migrate``, ``reap``, ...) in ``schema``."""
    digest = hashlib.sha256(f"pgqueue:{purpose}:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)
