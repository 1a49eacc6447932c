"""The scale driver's statements, from ``sql/scale.sql``, for the tables of one schema,
and how the driver runs most of them.

The statements come through :mod:`pgqueue_bench.sql.queries`, the loader every driver
uses; this module names the file once and adds the runner the history, measurement
and soak modules share: a connection of its own in autocommit (VACUUM and CHECKPOINT
refuse to run in a transaction), rows as dicts keyed by column name.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from pgqueue_bench.sql.queries import schema_statement_in

STATEMENTS = "scale.sql"


def statement(name: str, schema: str) -> sql.Composed:
    """The statement called ``name`` in ``scale.sql``, for the tables of ``schema``."""
    return schema_statement_in(STATEMENTS, name, schema)


def run_statement(
    url: str, name: str, schema: str, params: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Run the statement called ``name`` for ``schema`` with ``params`` on a connection
    of its own; its rows, none for a statement that returns none."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        cur = conn.cursor(row_factory=dict_row)
        cur.execute(statement(name, schema), params)
        return cur.fetchall() if cur.description else []
