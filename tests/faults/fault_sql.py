"""The named statements of ``faults.sql``, and running them on a private server."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from pgqueue.queries import named_statements

SQL_FILE = Path(__file__).with_name("faults.sql")


@cache
def _statements() -> dict[str, str]:
    return named_statements(SQL_FILE.read_text())


def statement(name: str, /, **parts: str | sql.Composable) -> sql.Composed:
    """The statement called ``name``; a ``str`` part is an identifier (``schema``,
    ``database``, ``tablespace``), a Composable part goes in as it is."""
    try:
        body = _statements()[name]
    except KeyError:
        raise KeyError(f"no statement named {name!r} in faults.sql") from None
    filled = {key: sql.Identifier(v) if isinstance(v, str) else v for key, v in parts.items()}
    return sql.SQL(body).format(**filled)


def run(
    url: str, name: str, params: dict[str, Any] | None = None, /, **parts: str | sql.Composable
) -> list[dict[str, Any]]:
    """Run one statement on its own autocommit connection; return its rows."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        return execute(conn, name, params, **parts)


def execute(
    conn: psycopg.Connection,
    name: str,
    params: dict[str, Any] | None = None,
    /,
    **parts: str | sql.Composable,
) -> list[dict[str, Any]]:
    """Run one statement on ``conn``; return its rows."""
    cur = conn.cursor(row_factory=dict_row)
    cur.execute(statement(name, **parts), params)
    return cur.fetchall() if cur.description else []
