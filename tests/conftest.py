"""Fixtures shared by every test that needs PostgreSQL.

The server is ``DATABASE_URL`` when set, otherwise the embedded PostgreSQL 18 in
``./.pgdata``. Each pytest-xdist worker gets a database of its own, and each test a
freshly migrated schema in it, so ``pytest -n auto`` is safe and tests never see each
other's jobs.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgqueue import Queue, embedded, migrate

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def server_url() -> str:
    """The PostgreSQL server under test (a maintenance database on it)."""
    explicit = os.environ.get("DATABASE_URL")
    if explicit:
        return explicit
    return embedded.start(REPO_ROOT / ".pgdata")


@pytest.fixture(scope="session")
def database_url(server_url: str, worker_id: str, testrun_uid: str) -> Iterator[str]:
    """A database of this test process's own on the server under test.

    The name carries the run's id too, so two test runs against one server (two
    checkouts, or a developer and CI) never drop each other's databases."""
    name = f"pgqueue_test_{testrun_uid[:8]}_{worker_id}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield make_conninfo(server_url, dbname=name)
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture(scope="session")
def server_version(database_url: str) -> int:
    """The server's major version (15, 18, ...)."""
    with psycopg.connect(database_url) as conn:
        return conn.info.server_version // 10000


@pytest.fixture
def schema(database_url: str) -> Iterator[str]:
    """A migrated schema of this test's own, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    migrate(database_url, name)
    yield name
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def queue(database_url: str, schema: str) -> Iterator[Queue]:
    """A Queue on this test's schema."""
    q = Queue.connect(database_url, schema=schema, max_size=20)
    try:
        yield q
    finally:
        q.close()


@pytest.fixture
def db(database_url: str) -> Iterator[psycopg.Connection]:
    """A plain autocommit connection to this test process's database, for assertions."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn
