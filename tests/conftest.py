"""Fixtures shared by every test that needs PostgreSQL.

They are the ``pgqueue_*`` fixtures of pgqueue's own pytest plugin (pytest-pgqueue),
under the short names this suite uses: the server is ``DATABASE_URL`` when set,
otherwise the embedded PostgreSQL 18 in ``./.pgdata``; each pytest-xdist worker gets a
database of its own, and each test a freshly migrated schema in it, so
``pytest -n auto`` is safe and tests never see each other's jobs.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from pgqueue import Queue


@pytest.fixture(scope="session")
def server_url(pgqueue_server_url: str) -> str:
    """The PostgreSQL server under test (its maintenance database)."""
    return pgqueue_server_url


@pytest.fixture(scope="session")
def database_url(pgqueue_database_url: str) -> str:
    """A database of this test process's own on the server under test."""
    return pgqueue_database_url


@pytest.fixture(scope="session")
def server_version(database_url: str) -> int:
    """The server's major version (15, 18, ...)."""
    with psycopg.connect(database_url) as conn:
        return conn.info.server_version // 10000


@pytest.fixture
def schema(pgqueue_schema: str) -> str:
    """A migrated schema of this test's own, dropped afterwards."""
    return pgqueue_schema


@pytest.fixture
def queue(pgqueue_queue: Queue) -> Queue:
    """A Queue on this test's schema."""
    return pgqueue_queue


@pytest.fixture
def db(database_url: str) -> Iterator[psycopg.Connection]:
    """A plain autocommit connection to this test process's database, for assertions."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def refuse_poison(db: psycopg.Connection, schema: str) -> None:
    """Make PostgreSQL refuse, by a trigger, any job row whose task is 'poison': a
    failure inside the database, for tests of what a failed statement leaves behind."""
    db.execute(
        f"""CREATE FUNCTION {schema}.refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.task = 'poison' THEN RAISE EXCEPTION 'poison row'; END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_poison BEFORE INSERT ON {schema}.active_jobs
            FOR EACH ROW EXECUTE FUNCTION {schema}.refuse_poison();"""
    )
