"""Named SQL statements, loaded from ``sql/statements/*.sql`` and bound to a schema.

Every statement pgqueue runs is named Entity+Verb, in the file of its subject
(producing, claiming, outcomes, jobs, dependencies, controls, stats, registry, history,
schedules, setup). Each state transition is one statement, guarded by the state it
leaves (and by the lease token where a worker holds the job), and reads only the
database clock.

Placeholders: ``{schema}`` is the quoted schema name, ``{lock}`` the row-lock clause of
a claim, ``{channel}`` the schema's notification channel (see :func:`bind`); the few
statements that name a partition, a filter or a bound have their own, filled by
:func:`compose`. A statement whose name starts with an underscore is a fragment that
others include where they write ``{_name}``, so that a part two statements share is
written once. Parameters use psycopg's ``%(name)s`` style.
"""

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


_FRAGMENT = re.compile(r"\{(_\w+)\}")


@cache
def _raw_queries() -> dict[str, str]:
    """Every statement of every file, by name, its fragments included."""
    statements: dict[str, str] = {}
    for file in sorted(
        resources.files("pgqueue.sql").joinpath("statements").iterdir(), key=lambda f: f.name
    ):
        if not file.name.endswith(".sql"):
            continue
        for name, body in named_statements(file.read_text()).items():
            if name in statements:
                raise ValueError(f"statement {name!r} is named twice (again in {file.name})")
            statements[name] = body
    fragments = {name: body for name, body in statements.items() if name.startswith("_")}
    return {
        name: _FRAGMENT.sub(lambda found: fragments[found.group(1)], body)
        for name, body in statements.items()
        if not name.startswith("_")
    }


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
    """Every named statement (fragments left out)."""
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
        raise KeyError(f"no statement named {name!r} in sql/statements") from None
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
