"""Numbered SQL migrations, applied in order, each in its own transaction.

Every file runs under a transaction-scoped advisory lock and re-checks the
migrations table once it holds it, so any number of processes may call
:func:`migrate` at once: one applies each file, the others wait and skip it.
Transaction-scoped locks also keep this safe behind PgBouncer in transaction mode.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import psycopg
from psycopg import sql

from pgqueue import queries
from pgqueue.locks import advisory_key
from pgqueue.settings import DEFAULT_SCHEMA, check_schema

_FILE_NAME = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True)
class Migration:
    """One ``NNNN_name.sql`` file shipped in ``pgqueue/sql/migrations``."""

    version: int
    name: str
    text: str


def available() -> list[Migration]:
    """Every migration shipped with this version of pgqueue, in order."""
    found = []
    for entry in resources.files("pgqueue.sql").joinpath("migrations").iterdir():
        match = _FILE_NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text()))
    return sorted(found, key=lambda m: m.version)


def applied(conn: psycopg.Connection, schema: str = DEFAULT_SCHEMA) -> list[int]:
    """Versions already recorded in ``schema``; empty when the schema does not exist yet."""
    # check_schema() allows only plain lower-case names, which need no quoting here.
    exists = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f"{schema}.migrations",)
    ).fetchone()
    if not exists or not exists[0]:
        return []
    return [row[0] for row in conn.execute(queries.bind("migration_applied", schema))]


def migrate(conninfo: str, schema: str = DEFAULT_SCHEMA) -> list[int]:
    """Apply every pending migration to ``schema``; return the versions this call applied."""
    check_schema(schema)
    lock_key = advisory_key("migrate", schema)
    done: list[int] = []
    # No server-side prepared statements: migrate must work through PgBouncer too.
    with psycopg.connect(conninfo, autocommit=False, prepare_threshold=None) as conn:
        for migration in available():
            with conn.transaction():
                conn.execute(queries.bind("migration_lock", schema), {"key": lock_key})
                conn.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema))
                )
                conn.execute(queries.bind("migration_table_create", schema))
                if migration.version in applied(conn, schema):
                    continue
                conn.execute(sql.SQL(migration.text).format(schema=sql.Identifier(schema)))
                conn.execute(
                    queries.bind("migration_record", schema),
                    {"version": migration.version, "name": migration.name},
                )
                done.append(migration.version)
    return done
