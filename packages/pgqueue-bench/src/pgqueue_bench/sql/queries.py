"""Named SQL statements of the benchmark drivers, loaded from ``sql/bench.sql``.

The jobs table is read and written only through :class:`pgqueue.Queue`; these
statements touch what the drivers own: the delivery table the recording handler
writes, server settings for the environment block, and the private servers'
fault injection.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from psycopg import sql

from pgqueue.queries import named_statements
from pgqueue.queries import one_row as one_row  # re-exported: the drivers read it here


@cache
def _statements(filename: str = "bench.sql") -> dict[str, str]:
    return named_statements(resources.files("pgqueue_bench.sql").joinpath(filename).read_text())


def statement(name: str, /, **parts: sql.Composable) -> sql.Composed:
    """The statement called ``name``, its ``{placeholders}`` filled with ``parts``
    (identifiers and literals built with :mod:`psycopg.sql`)."""
    return statement_in("bench.sql", name, **parts)


def statement_in(filename: str, name: str, /, **parts: sql.Composable) -> sql.Composed:
    """The statement called ``name`` in ``sql/<filename>``, filled as :func:`statement`
    fills one of ``bench.sql``: a driver with statements of its own keeps them apart."""
    try:
        body = _statements(filename)[name]
    except KeyError:
        raise KeyError(f"no statement named {name!r} in {filename}") from None
    return sql.SQL(body).format(**parts)


def schema_statement(name: str, schema: str) -> sql.Composed:
    """The statement called ``name`` for the tables of ``schema``."""
    return statement(name, schema=sql.Identifier(schema))


def schema_statement_in(filename: str, name: str, schema: str) -> sql.Composed:
    """The statement called ``name`` in ``sql/<filename>``, for the tables of ``schema``:
    :func:`schema_statement` for a driver with statements of its own."""
    return statement_in(filename, name, schema=sql.Identifier(schema))
