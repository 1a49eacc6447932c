"""Creating and upgrading pgqueue's schema.

A new schema is created from ``sql/schema.sql``, the current schema as a whole, and
recorded at the latest version. A schema created by an earlier version is brought up to
date by the numbered upgrade migrations in ``sql/migrations`` that it has not had,
applied in order, each in its own transaction. (Version 1 there is the schema as first
released; a test requires that it plus every upgrade builds what schema.sql builds.)

Every step runs under a transaction-scoped advisory lock and re-checks the migrations
table once it holds it, so any number of processes may call :func:`migrate` at once:
one applies each step, the others wait and skip it. Transaction-scoped locks also keep
this safe behind PgBouncer in transaction mode.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

import psycopg
from psycopg import sql

from pgqueue import connections, history, queries
from pgqueue.errors import PgQueueError
from pgqueue.locks import advisory_key
from pgqueue.settings import DEFAULT_SCHEMA, check_schema

_FILE_NAME = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True)
class Migration:
    """One ``NNNN_name.sql`` file shipped in ``pgqueue/sql/migrations``."""

    version: int
    name: str
    text: str


class UnknownSchemaVersion(PgQueueError):
    """The schema records migrations that this version of pgqueue did not ship."""


def current_schema() -> str:
    """The text of ``sql/schema.sql``: the whole current schema, for a new database."""
    return resources.files("pgqueue.sql").joinpath("schema.sql").read_text()


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


def migrate(
    conninfo: str, schema: str = DEFAULT_SCHEMA, *, through_upgrades: bool = False
) -> list[int]:
    """Create ``schema``, or apply its pending upgrades; return the versions this call
    applied (every version, for a new schema). Also creates the coming days' partitions
    of the finished jobs (see :mod:`pgqueue.history`).

    ``through_upgrades=True`` builds a new schema as an old one would have been brought
    here, from version 1 and every upgrade, instead of from ``schema.sql``: the test of
    the upgrades compares the two."""
    check_schema(schema)
    lock_key = advisory_key("migrate", schema)
    shipped = available()
    done: list[int] = []
    # No server-side prepared statements: migrate must work through PgBouncer too.
    with connections.connect(conninfo) as conn:
        for migration in shipped:
            with conn.transaction():
                conn.execute(queries.bind("migration_lock", schema), {"key": lock_key})
                conn.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema))
                )
                conn.execute(queries.bind("migration_table_create", schema))
                recorded = applied_migrations(conn, schema)
                _check_known(recorded, shipped, schema)
                if not recorded and not through_upgrades:
                    # A new schema: the current one at once, recorded as every version.
                    conn.execute(_formatted(current_schema(), schema))
                    for each in shipped:
                        _record(conn, schema, each)
                    done = [each.version for each in shipped]
                    break
                if migration.version in recorded:
                    continue
                conn.execute(_formatted(migration.text, schema))
                _record(conn, schema, migration)
                done.append(migration.version)
        history.create_days(
            conn,
            schema,
            lambda c: bool(c.execute(queries.bind("migration_lock", schema), {"key": lock_key})),
        )
    return done


def pending(conn: psycopg.Connection, schema: str = DEFAULT_SCHEMA) -> list[int]:
    """The shipped versions ``schema`` has not had yet (all of them when it does not
    exist). Raises UnknownSchemaVersion for a schema made by another pgqueue."""
    shipped = available()
    done = set(applied(conn, schema))
    if done:
        _check_known(applied_migrations(conn, schema), shipped, schema)
    return [m.version for m in shipped if m.version not in done]


def unmigrated(conn: psycopg.Connection, schema: str = DEFAULT_SCHEMA) -> str | None:
    """What keeps ``schema`` from serving this version of pgqueue, in one line, or None
    when it has every migration shipped (see :func:`lacking`). Each command adds how to
    fix it in its own words. Raises UnknownSchemaVersion for a schema made by another
    pgqueue."""
    missing = pending(conn, schema)
    if not missing:
        return None
    return lacking(schema, None if len(missing) == len(available()) else missing)


def lacking(schema: str, versions: Sequence[int] | None = None) -> str:
    """``schema S lacks migrations 3, 4``; without ``versions``, ``schema S is not
    migrated`` (it has none of them, or does not exist)."""
    if versions:
        return f"schema {schema} lacks migrations {', '.join(map(str, versions))}"
    return f"schema {schema} is not migrated"


def applied_migrations(conn: psycopg.Connection, schema: str) -> dict[int, str]:
    """Version -> name of the migrations recorded in ``schema`` (which must exist)."""
    rows = conn.execute(queries.bind("migration_applied", schema)).fetchall()
    return {version: name for version, name in rows}


def _check_known(recorded: dict[int, str], shipped: list[Migration], schema: str) -> None:
    names = {m.version: m.name for m in shipped}
    unknown = sorted(v for v, name in recorded.items() if names.get(v) != name)
    if unknown:
        raise UnknownSchemaVersion(
            f"schema {schema!r} records migrations this version of pgqueue does not know "
            f"({', '.join(f'{v} {recorded[v]}' for v in unknown)}): it was migrated by a "
            f"newer pgqueue; install that version (or a later one) here"
        )


def _formatted(text: str, schema: str) -> sql.Composed:
    return sql.SQL(text).format(schema=sql.Identifier(schema))


def _record(conn: psycopg.Connection, schema: str, migration: Migration) -> None:
    conn.execute(
        queries.bind("migration_record", schema),
        {"version": migration.version, "name": migration.name},
    )
