"""Checks on everything a producer hands to pgqueue, before it reaches PostgreSQL.

Each failure raises :class:`~pgqueue.errors.ValidationError` naming the field, so the
HTTP API can answer 422 and a library caller sees which argument was wrong.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pgqueue.errors import ValidationError
from pgqueue.jsonb import MAX_DEPTH, UndecodableJson

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
NAME_MAX_LENGTH = 128
"""Queue and task names: 1 to 128 characters of ``A-Z a-z 0-9 _ . : -``, starting
with a letter or digit."""

PRIORITY_MIN = -1000
PRIORITY_MAX = 1000
"""Higher priorities are claimed first."""

PAYLOAD_MAX_BYTES = 1_048_576
"""The default largest payload, as JSON text (``Queue(max_payload_bytes=...)``)."""
RESULT_MAX_BYTES = 1_048_576
"""The default largest result, as JSON text (``Queue(max_result_bytes=...)``)."""
BYTE_LIMIT_MAX = 256 * 1_048_576
"""The highest payload or result limit: a quarter of PostgreSQL's 1 GB field limit,
which its JSON text must stay under with room for escaping."""
IDEMPOTENCY_KEY_MAX_LENGTH = 255
MAX_ATTEMPTS_LIMIT = 1000
RUN_AT_MIN = datetime(1970, 1, 1, tzinfo=UTC)
RUN_AT_MAX = datetime(9999, 1, 1, tzinfo=UTC)
"""Times outside this range cannot be read back into Python in every time zone."""
_JSONB_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))
"""The options of every payload and result's JSON text: compact, ASCII, no NaN."""


def _one_shot_encoder() -> Callable[[Any], str]:
    """A function writing a value as :data:`_JSONB_ENCODER` does, without its cost per call.

    ``JSONEncoder.encode`` builds a new C encoder for every value it writes, which is
    most of the time a small payload takes. The C encoder built here once is used for
    every value instead: it keeps no state between calls, since it checks for circular
    references through no table of its own (a circular value goes past the recursion
    limit, and :func:`jsonb_text` refuses it as nested too deeply). Where the C encoder
    is missing, or writes another text than ``encode`` would, ``encode`` it is.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _JSONB_ENCODER.encode
    try:
        chunks = make(
            None,  # no circular-reference table
            _JSONB_ENCODER.default,
            json.encoder.encode_basestring_ascii,
            None,  # no indent
            _JSONB_ENCODER.key_separator,
            _JSONB_ENCODER.item_separator,
            False,  # sort_keys
            False,  # skipkeys
            False,  # allow_nan
        )
    except TypeError:  # another signature than CPython 3.11's
        return _JSONB_ENCODER.encode

    def encode(value: Any) -> str:
        return "".join(chunks(value, 0))

    probe = {"a": [1, 2.5, "\u00e9\n", None, True], "": {"b": -0.0}}
    try:
        same = encode(probe) == _JSONB_ENCODER.encode(probe)
    except Exception:
        same = False
    return encode if same else _JSONB_ENCODER.encode


_encode_jsonb = _one_shot_encoder()
_NUL_ESCAPE = "\\u0000"
"""How json.dumps writes a NUL character."""
MAX_SECONDS = 10 * 366 * 86400
"""Delays and timeouts are capped at about ten years, well inside PostgreSQL's interval range."""


def name(field: str, value: object) -> str:
    """A queue or task name."""
    if not isinstance(value, str):
        raise ValidationError(field, "must be a string")
    problem = _name_problem(value)
    if problem is not None:
        raise ValidationError(field, problem)
    return value


@functools.lru_cache(maxsize=1024)
def _name_problem(value: str) -> str | None:
    """What is wrong with ``value`` as a queue or task name, or None. Cached: a producer
    names the same few queues and tasks over and over, and every job names two."""
    if not value:
        return "must not be empty"
    if len(value) > NAME_MAX_LENGTH:
        return f"must be at most {NAME_MAX_LENGTH} characters"
    if not NAME_PATTERN.fullmatch(value):
        return "may contain only letters, digits, '_', '.', ':' and '-', starting with a letter or digit"
    return None


def priority(value: object) -> int:
    """A priority in [PRIORITY_MIN, PRIORITY_MAX]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError("priority", "must be an integer")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise ValidationError("priority", f"must be between {PRIORITY_MIN} and {PRIORITY_MAX}")
    return value


def max_attempts(value: object) -> int:
    """How many claims a job gets before it is dead."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError("max_attempts", "must be an integer")
    if not 1 <= value <= MAX_ATTEMPTS_LIMIT:
        raise ValidationError("max_attempts", f"must be between 1 and {MAX_ATTEMPTS_LIMIT}")
    return value


def seconds(field: str, value: object, *, positive: bool = False) -> float:
    """A finite, non-negative (or positive) number of seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValidationError(field, "must be a number of seconds")
    if not math.isfinite(value):
        raise ValidationError(field, "must be finite")
    if positive and value <= 0:
        raise ValidationError(field, "must be greater than 0")
    if value < 0:
        raise ValidationError(field, "must not be negative")
    if value > MAX_SECONDS:
        raise ValidationError(field, f"must be at most {MAX_SECONDS} seconds (about ten years)")
    return float(value)


def run_at(value: object) -> datetime:
    """A timezone-aware moment; naive datetimes are ambiguous and refused."""
    if not isinstance(value, datetime):
        raise ValidationError("run_at", "must be a datetime")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValidationError("run_at", "must include a time zone")
    if not RUN_AT_MIN <= value < RUN_AT_MAX:
        # Outside this range a timestamptz may be stored yet not read back into Python.
        raise ValidationError("run_at", "must be between 1970-01-01 and 9999-01-01 (UTC)")
    return value


def idempotency_key(value: object, field: str = "idempotency_key") -> str:
    """An idempotency key: 1 to 255 characters."""
    if not isinstance(value, str):
        raise ValidationError(field, "must be a string")
    if not value:
        raise ValidationError(field, "must not be empty")
    if len(value) > IDEMPOTENCY_KEY_MAX_LENGTH:
        raise ValidationError(field, f"must be at most {IDEMPOTENCY_KEY_MAX_LENGTH} characters")
    if "\x00" in value:
        raise ValidationError(field, "must not contain NUL characters")
    return value


def unique_key(value: object) -> str:
    """A unique key: the same rules as an idempotency key (1 to 255 characters)."""
    return idempotency_key(value, "unique_key")


PARTITION_KEY_MAX_LENGTH = 200
"""How many characters a partition key may have."""


def partition_key(value: object, field: str = "partition_key") -> str:
    """A job's partition key: a string of 1 to PARTITION_KEY_MAX_LENGTH characters."""
    if not isinstance(value, str):
        raise ValidationError(field, "must be a string")
    if not value:
        raise ValidationError(field, "must not be empty")
    if len(value) > PARTITION_KEY_MAX_LENGTH:
        raise ValidationError(field, f"must be at most {PARTITION_KEY_MAX_LENGTH} characters")
    if "\x00" in value:
        raise ValidationError(field, "must not contain NUL characters")
    return value


TAGS_MAX = 16
"""How many tags a job may carry."""
TAG_MAX_LENGTH = 64
"""How many characters a tag may have."""


def tags(value: object, field: str = "tags") -> tuple[str, ...]:
    """A job's tags: a list of at most TAGS_MAX strings of 1 to TAG_MAX_LENGTH
    characters, each kept once, in the order first given. A single string is refused
    rather than read as its characters."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ValidationError(field, "must be a list of strings")
    kept = tuple(dict.fromkeys(value))
    if len(kept) > TAGS_MAX:
        raise ValidationError(field, f"must hold at most {TAGS_MAX} tags")
    for tag in kept:
        if not isinstance(tag, str):
            raise ValidationError(field, "must be a list of strings")
        if not tag:
            raise ValidationError(field, "must not hold an empty tag")
        if len(tag) > TAG_MAX_LENGTH:
            raise ValidationError(field, f"must hold tags of at most {TAG_MAX_LENGTH} characters")
        if "\x00" in tag:
            raise ValidationError(field, "must not contain NUL characters")
        try:
            tag.encode()
        except UnicodeEncodeError:
            raise ValidationError(field, "must hold tags of valid Unicode text") from None
    return kept


def payload_filter(value: object, field: str = "payload_contains") -> str | None:
    """What a payload search must contain, as jsonb text, from a JSON object or its text;
    None for an empty object, which every payload contains."""
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValidationError(field, f"is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ValidationError(field, "must be a JSON object")
    if not value:
        return None
    return jsonb_text(field, value)


def jsonb_text(field: str, value: Any) -> str:
    """``value`` as JSON text that PostgreSQL's jsonb accepts.

    jsonb stores neither NaN nor Infinity, nor the NUL character, so those are refused
    here with the field named rather than by the server mid-transaction, as is a value
    nested more than MAX_DEPTH deep.
    """
    try:
        text = _encode_jsonb(value)
    except ValueError:
        _refuse_nul(field, value)  # a NUL or too deep a value is named first
        raise ValidationError(
            field, "contains NaN or Infinity, which JSON cannot represent"
        ) from None
    except (TypeError, RecursionError) as exc:
        _refuse_nul(field, value)
        raise ValidationError(field, f"is not JSON-serialisable ({exc})") from None
    # The text tells when the value needs no walk: json.dumps writes every NUL, in a key
    # or a string, as the escape \u0000, and opens every level of nesting with a
    # bracket. Scanning the text runs at C speed; walking the value in Python cost more
    # than the rest of a small payload's checks together.
    if _NUL_ESCAPE in text or text.count("{") + text.count("[") > MAX_DEPTH:
        _refuse_nul(field, value)
    return text


def payload(value: object) -> str:
    """A job payload: a JSON object, as jsonb text. Its size is checked on enqueue,
    against the limit of the Queue it goes through (:func:`within_limit`)."""
    if not isinstance(value, dict):
        if isinstance(value, UndecodableJson):  # read from a row, as a schedule's is
            raise ValidationError("payload", f"could not be decoded: {value.reason}")
        raise ValidationError("payload", "must be a JSON object")
    return jsonb_text("payload", value)


class TooLarge(ValidationError):
    """A payload or result over its size limit."""

    def __init__(self, field: str, size: int, limit: int) -> None:
        super().__init__(field, f"is {size} bytes, over the limit of {limit}")
        self.size = size
        self.limit = limit
        self.index: int | None = None
        """Which of a batch's items it is, when it is one of a batch's."""

    def __str__(self) -> str:
        return f"{self.field} {self.message}"


def utf8_length(text: str) -> int:
    """How many bytes ``text`` takes in UTF-8, without encoding it when it is ASCII."""
    return len(text) if text.isascii() else len(text.encode())


def within_limit(field: str, text: str, limit: int) -> str:
    """``text`` if it takes at most ``limit`` bytes in UTF-8; raises :class:`TooLarge`."""
    # Characters never outnumber bytes: only a longer text needs measuring.
    if len(text) > limit or (not text.isascii() and len(text) * 4 > limit):
        size = utf8_length(text)
        if size > limit:
            raise TooLarge(field, size, limit)
    return text


def byte_limit(field: str, value: object) -> int:
    """A payload or result size limit: 1 byte to BYTE_LIMIT_MAX."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(field, "must be an integer number of bytes")
    if not 1 <= value <= BYTE_LIMIT_MAX:
        raise ValidationError(field, f"must be between 1 and {BYTE_LIMIT_MAX} bytes")
    return value


def _refuse_nul(field: str, value: Any, depth: int = 0) -> None:
    """Raise if ``value`` holds a NUL character or nests more than MAX_DEPTH lists and
    objects; ``depth`` is how many enclose it."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValidationError(
                field, "contains a NUL character (\\u0000), which PostgreSQL cannot store"
            )
    elif isinstance(value, dict):
        if depth >= MAX_DEPTH:
            raise ValidationError(field, "is nested too deeply")
        for key, item in value.items():
            _refuse_nul(field, key, depth + 1)
            _refuse_nul(field, item, depth + 1)
    elif isinstance(value, (list, tuple)):
        if depth >= MAX_DEPTH:
            raise ValidationError(field, "is nested too deeply")
        for item in value:
            _refuse_nul(field, item, depth + 1)
