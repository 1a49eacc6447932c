"""Reading jsonb columns so that a value Python cannot load breaks nothing around it.

PostgreSQL stores JSON nested thousands of levels deep; Python's decoder gives up past
its recursion limit (about a thousand levels). A payload like that, written around
pgqueue's validation (by another client, or by hand), would make every statement that
returns its row raise after the fact: a claim that committed but whose jobs never reached
the worker, a reap rolled back on every try (so no expired lease in the schema would
ever be reaped again), an API page that cannot be rendered. Read through
:func:`cursor`, such a value comes back as :class:`UndecodableJson` instead, and the
rest of the row, and of the result, as usual.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Literal, overload

import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import JsonbBinaryLoader, JsonbLoader


class UndecodableJson(str):
    """The text of a jsonb value that Python could not load; ``reason`` says why.

    It is a ``str``, so it can still be shown (the API renders it as a string), but a
    worker must never hand it to a handler as the payload it expected.
    """

    reason: str

    def __new__(cls, text: str, reason: str) -> UndecodableJson:
        value = super().__new__(cls, text)
        value.reason = reason
        return value


def load_json(data: str | bytes) -> Any:
    """``json.loads``, except that a value nested too deeply for Python comes back as
    :class:`UndecodableJson` instead of raising."""
    try:
        return json.loads(data)
    except RecursionError:
        text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
        return UndecodableJson(text, "JSON nested more deeply than Python can decode")


def load_json_texts(texts: Sequence[str | None]) -> list[Any]:
    """``load_json`` of each of ``texts`` (jsonb values read as text; None stays None).

    A claim reads hundreds of payloads at once. Parsing them as one JSON array costs a
    fraction of a parse per value; only when that fails (one value is nested too
    deeply) is each value loaded on its own, so that the others still load.
    """
    present = [text for text in texts if text is not None]
    try:
        loaded = iter(json.loads("[" + ",".join(present) + "]"))
    except RecursionError:
        loaded = iter([load_json(text.encode()) for text in present])
    return [None if text is None else next(loaded) for text in texts]


# psycopg reads _loads from the class (an attribute, not a method), as annotated here.
class _TolerantJsonbLoader(JsonbLoader):
    _loads: Callable[[str | bytes], Any] = load_json


class _TolerantJsonbBinaryLoader(JsonbBinaryLoader):
    _loads: Callable[[str | bytes], Any] = load_json


@overload
def cursor(
    conn: psycopg.Connection[Any], *, tuples: Literal[False] = False
) -> psycopg.Cursor[dict[str, Any]]: ...


@overload
def cursor(
    conn: psycopg.Connection[Any], *, tuples: Literal[True]
) -> psycopg.Cursor[tuple[Any, ...]]: ...


def cursor(conn: psycopg.Connection[Any], *, tuples: bool = False) -> psycopg.Cursor[Any]:
    """A dict-row cursor (tuple rows with ``tuples=True``) on ``conn`` that reads jsonb
    with :func:`load_json`. The loaders are the cursor's own: the connection, which may
    be the caller's, is left as it is."""
    cur = conn.cursor(row_factory=tuple_row if tuples else dict_row)
    cur.adapters.register_loader("jsonb", _TolerantJsonbLoader)
    cur.adapters.register_loader("jsonb", _TolerantJsonbBinaryLoader)
    return cur
