"""Named SQL statements, loaded from ``sql/queries.sql`` and bound to a schema."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import TypeVar

from psycopg import Cursor, sql

from pgqueue.settings import done_channel, notify_channel

_Row = TypeVar("_Row")

_NAME_LINE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)

# Row-lock clauses a claim may use. ``for-update`` exists only so the benchmark can
# show what SKIP LOCKED buys: with it, concurrent claimers queue up behind each other.
CLAIM_LOCKS = {
    "skip-locked": sql.SQL("FOR UPDATE SKIP LOCKED"),
    "for-update": sql.SQL("FOR UPDATE"),
}


@cache
def _raw_queries() -> dict[str, str]:
    return named_statements(resources.files("pgqueue.sql").joinpath("queries.sql").read_text())


def named_statements(text: str) -> dict[str, str]:
    """The statements of a file of named SQL, by name: each begins at a ``-- name: NAME``
    line and runs to the next, its comment lines and final semicolon dropped.

    pgqueue's own statements and those of the benchmark drivers and fault scenarios are
    kept this way. Comments are for readers of the .sql file; dropping them keeps a
    %(name)s mentioned in prose from being taken for a parameter."""
    parts = _NAME_LINE.split(text)
    # parts = [header, name1, body1, name2, body2, ...]
    return {
        name: _strip_comments(body) for name, body in zip(parts[1::2], parts[2::2], strict=True)
    }


def _strip_comments(body: str) -> str:
    lines = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
    return "\n".join(lines).strip().rstrip(";")


def query_names() -> list[str]:
    """Every named query in the SQL file."""
    return sorted(_raw_queries())


@cache
def bind(name: str, schema: str, lock: str = "skip-locked") -> sql.SQL:
    """The statement called ``name`` with its placeholders filled for ``schema``:
    ``{schema}``, ``{lock}``, the schema's LISTEN/NOTIFY channel as ``{channel}``
    (a name) and ``{channel_name}`` (a string), and the channel of finished jobs that
    someone waits for as ``{done_channel}`` and ``{done_channel_name}``."""
    # Rendered once: psycopg renders a Composed again on every execute, which a worker
    # claiming thousands of jobs a second would pay each time.
    return sql.SQL(compose(name, schema, lock).as_string(None))


def compose(
    name: str, schema: str, lock: str = "skip-locked", **parts: sql.Composable
) -> sql.Composed:
    """The statement called ``name`` with ``bind``'s placeholders filled and, for the few
    statements that have more (a partition's name, a list's filters), ``parts``."""
    try:
        body = _raw_queries()[name]
    except KeyError:
        raise KeyError(f"no query named {name!r} in queries.sql") from None
    return sql.SQL(body).format(
        schema=sql.Identifier(schema),
        lock=CLAIM_LOCKS[lock],
        channel=sql.Identifier(notify_channel(schema)),
        channel_name=sql.Literal(notify_channel(schema)),
        done_channel=sql.Identifier(done_channel(schema)),
        done_channel_name=sql.Literal(done_channel(schema)),
        **parts,
    )


def one_row(cur: Cursor[_Row]) -> _Row:
    """The row of a statement just executed on ``cur`` that always returns exactly one
    (an aggregate, ``now()``, a setting, an UPDATE of a row held locked): its absence
    is a broken statement, not data."""
    row = cur.fetchone()
    if row is None:
        raise RuntimeError("a statement that always returns one row returned none")
    return row
