"""Fixtures for the scale tests (helpers live in ``scale_support``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from scale_support import add_history


@pytest.fixture
def history(db: psycopg.Connection, schema: str) -> Callable[..., None]:
    """``history(count, state=..., age=...)`` adds finished jobs to this test's schema."""

    def add(count: int, **options: Any) -> None:
        add_history(db, schema, count, **options)

    return add
