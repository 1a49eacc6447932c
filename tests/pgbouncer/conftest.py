"""Fixtures for the PgBouncer tests (the harness lives in ``pgbouncer_support``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pgbouncer_support import MISSING_REASON, Bouncer, pgbouncer_binary, running_pgbouncer


@pytest.fixture(scope="session")
def pgbouncer_program() -> str:
    """The pgbouncer binary; the PgBouncer tests skip, saying why, without it."""
    binary = pgbouncer_binary()
    if binary is None:
        pytest.skip(MISSING_REASON)
    return binary


@pytest.fixture
def bouncer(database_url: str, pgbouncer_program: str) -> Iterator[Bouncer]:
    """PgBouncer in transaction pooling mode in front of this test process's database."""
    with running_pgbouncer(database_url, pgbouncer_program) as running:
        yield running
