"""Which server a driver runs on, and a fresh schema of its own for every run."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

from pgqueue import Queue, migrate
from pgqueue_bench.sql.queries import one_row, schema_statement, statement


@dataclass(frozen=True)
class Target:
    """A server to run on: its URL and a description safe to publish (no password)."""

    url: str
    server: str


def resolve_target(database_url: str | None = None) -> Target:
    """``database_url``, else ``DATABASE_URL``, else the embedded PostgreSQL (started
    if it is not running), as every driver and the test suite do."""
    if database_url:
        return Target(database_url, "given with --database-url")
    from_env = os.environ.get("DATABASE_URL")
    if from_env:
        return Target(from_env, "DATABASE_URL")
    from pgqueue import embedded

    return Target(embedded.start(), "embedded PostgreSQL (./.pgdata)")


def database_now(url: str) -> datetime:
    """The database clock: every duration a driver reports is measured on it."""
    with psycopg.connect(url, connect_timeout=10) as conn:
        cur = conn.cursor(row_factory=dict_row)
        cur.execute(statement("database_now"))
        now: datetime = one_row(cur)["now"]
    return now


def create_run_schema(url: str, prefix: str) -> str:
    """A newly migrated schema named ``<prefix>_<random>``, with the delivery table."""
    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    migrate(url, schema)
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(schema_statement("delivery_table_create", schema))
    return schema


def drop_schema(url: str, schema: str) -> None:
    """Drop a run's schema and everything in it."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(schema_statement("schema_drop", schema))


@contextmanager
def run_schema(url: str, prefix: str, *, keep: bool = False) -> Iterator[str]:
    """A fresh schema for one run, dropped afterwards unless ``keep``."""
    schema = create_run_schema(url, prefix)
    try:
        yield schema
    finally:
        if not keep:
            drop_schema(url, schema)


@contextmanager
def run_queue(url: str, prefix: str) -> Iterator[tuple[str, Queue]]:
    """A fresh schema for one run (see :func:`run_schema`) and a Queue on it with a
    small pool: the driver only enqueues and watches; the workers have their own."""
    with run_schema(url, prefix) as schema, Queue.connect(url, schema=schema, max_size=2) as queue:
        yield schema, queue


def with_database(url: str, dbname: str) -> str:
    """``url`` pointing at database ``dbname``. A URL stays a URL (some clients, such
    as asyncpg, read only URLs); a key=value string gets a new ``dbname``."""
    if url.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(url)
        return urlunsplit(parts._replace(path="/" + quote(dbname)))
    return make_conninfo(url, dbname=dbname)


@contextmanager
def fresh_database(server_url: str, name: str) -> Iterator[str]:
    """An empty database ``name`` on the server of ``server_url`` (dropped first if it
    exists, and dropped again afterwards); yields its URL."""
    identifier = sql.Identifier(name)
    with psycopg.connect(server_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(statement("database_drop", database=identifier))
        conn.execute(statement("database_create", database=identifier))
    try:
        yield with_database(server_url, name)
    finally:
        with psycopg.connect(server_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(statement("database_drop", database=identifier))
