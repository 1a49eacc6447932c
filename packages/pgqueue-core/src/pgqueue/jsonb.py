"""Reading jsonb columns so that a value Python cannot load breaks nothing around it.

PostgreSQL stores values that Python's ``json`` module refuses, or reads as something
else: JSON nested thousands of levels deep (Python gives up past its recursion limit,
about a thousand levels); numbers of any length, printed in full (``1e5000`` comes back
as 5,001 digits, more than Python converts to an int; a long enough number with a
fraction becomes Infinity as a float); and, in a database whose encoding is SQL_ASCII,
bytes that are not UTF-8. A value like that, written around pgqueue's validation (by
another client, an older version or by hand), would make every statement that returns
its row raise after the fact: a claim that committed but whose jobs never reached the
worker, a reap rolled back on every try (so no expired lease in the schema would ever
be reaped again), an API page that cannot be rendered. Read through :func:`cursor` (or
loaded with :func:`load_json`), such a value comes back as :class:`UndecodableJson`
instead, and the rest of the row, and of the result, as usual.

What does load is what pgqueue itself would store, so that every value read can be
written out again as JSON, by the API or into a jsonb column: never NaN or Infinity, no
string that UTF-8 cannot encode (a lone UTF-16 surrogate), and nothing nested deeper
than MAX_DEPTH.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, Literal, NoReturn, overload

import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import JsonbBinaryLoader, JsonbLoader

MAX_DEPTH = 200
"""How deeply pgqueue nests the lists and objects of a payload or result, at most: deeper
ones are refused on enqueue and ack (:mod:`pgqueue.validation`), and a stored one
(written around pgqueue) is read as undecodable. Far more than any real document, and
far less than what the API's JSON encoder writes (254 levels) or Python's recursion
limit, which a handler decoding it has."""


class UndecodableJson(str):
    """The text of a jsonb value that Python could not load; ``reason`` says why.

    It is a ``str``, so it can still be shown (the API renders it as a string), but a
    worker must never hand it to a handler as the payload it expected. The text can
    always be written out as UTF-8: bytes that were not are replaced (U+FFFD).
    """

    reason: str

    def __new__(cls, text: str, reason: str) -> UndecodableJson:
        if not text.isascii():
            text = text.encode("utf-8", "replace").decode("utf-8")
        value = super().__new__(cls, text)
        value.reason = reason
        return value

    def __getnewargs__(self) -> tuple[str, str]:  # type: ignore[override]
        # What copy, deepcopy (dataclasses.asdict) and pickle make it again from.
        return str(self), self.reason


class _Refused(ValueError):
    """A value the decoder read but refuses to hand over; its message is the reason."""


def _refuse_constant(name: str) -> NoReturn:
    raise _Refused(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _Refused("a number too large for a float, which Python would read as Infinity")
    return value


# One decoder for every value: json.loads with options would build one per call.
_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_constant=_refuse_constant)
# Only a \uD800-\uDFFF escape can put a lone surrogate in a string decoded from UTF-8
# text, so only the (rare) texts holding one are walked to look for it. PostgreSQL
# itself never writes such an escape: it stores the character.
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _decode(text: str) -> Any:
    """``text`` loaded; raises RecursionError, ValueError or _Refused when it cannot be."""
    return _checked(text, _DECODER.decode(text))


def _checked(text: str, value: Any) -> Any:
    """``value``, loaded from ``text``, unless it is what pgqueue would not store; the
    text tells at C speed when there is no need to walk the value to know."""
    if "\\u" in text and SURROGATE_ESCAPE.search(text) and has_lone_surrogate(value):
        raise _Refused("a string holds a lone UTF-16 surrogate, which UTF-8 cannot encode")
    if text.count("{") + text.count("[") > MAX_DEPTH and _nests_deeper(value, MAX_DEPTH):
        raise _Refused(f"JSON nested more than {MAX_DEPTH} levels deep, deeper than pgqueue stores")
    return value


def _checked_or_undecodable(text: str, value: Any) -> Any:
    try:
        return _checked(text, value)
    except _Refused as exc:
        return UndecodableJson(text, str(exc))


def _nests_deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` lists and objects."""
    pending = [(value, 1)] if isinstance(value, (dict, list)) else []
    while pending:
        item, depth = pending.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        pending.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def has_lone_surrogate(value: Any) -> bool:
    """Whether a string in ``value`` (its keys too) holds a lone UTF-16 surrogate, which
    neither UTF-8 nor jsonb can hold. Look only where :data:`SURROGATE_ESCAPE` matches
    the text the value was decoded from."""
    # Iterative: the value may be nested as deeply as Python can decode.
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


def _reason(exc: BaseException) -> str:
    """Why a value could not be loaded, from what loading it raised."""
    if isinstance(exc, RecursionError):
        return "JSON nested more deeply than Python can decode"
    if isinstance(exc, UnicodeDecodeError):
        return f"text that is not valid UTF-8 ({exc.reason} at byte {exc.start})"
    if isinstance(exc, _Refused):
        return str(exc)
    if isinstance(exc, json.JSONDecodeError):
        return f"not JSON: {exc}"
    if "integer string conversion" in str(exc):
        limit = sys.get_int_max_str_digits()
        return f"a number with more than {limit} digits, more than Python converts to an int"
    return f"a value Python cannot load: {exc}"


def load_json(data: str | bytes) -> Any:
    """``json.loads``, except that a value Python cannot load as it is stored (see the
    module's documentation) comes back as :class:`UndecodableJson` instead of raising,
    or instead of a value that could not be written back."""
    try:
        return _decode(data.decode("utf-8") if isinstance(data, bytes) else data)
    except (RecursionError, ValueError) as exc:
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        return UndecodableJson(text, _reason(exc))


def load_json_texts(texts: Sequence[str | None]) -> list[Any]:
    """``load_json`` of each of ``texts`` (jsonb values read as text; None stays None).

    A claim reads hundreds of payloads at once. Parsing them as one JSON array costs a
    fraction of a parse per value; only when that fails (one value cannot be loaded) is
    each value loaded on its own, so that the others still load. Likewise, what
    :func:`load_json` looks for in a value's text is looked for in all of them at once,
    and only the values whose text may hold it are checked.
    """
    present = [text for text in texts if text is not None]
    joined = ",".join(present)
    try:
        values = _DECODER.decode("[" + joined + "]")
    except (RecursionError, ValueError):
        values = [load_json(text) for text in present]
    else:
        if "\\u" in joined:
            values = [_checked_or_undecodable(t, v) for t, v in zip(present, values, strict=True)]
        elif max(map(len, present), default=0) > 2 * MAX_DEPTH:
            # Only a text of more than MAX_DEPTH brackets can nest deeper.
            for i, text in enumerate(present):
                if len(text) > 2 * MAX_DEPTH:
                    values[i] = _checked_or_undecodable(text, values[i])
    loaded = iter(values)
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
