"""Loading many jsonb texts at once, and what happens to one Python cannot load."""

import copy
import json
import pickle

import pytest

from pgqueue.jsonb import MAX_DEPTH, UndecodableJson, load_json, load_json_texts

TOO_DEEP = "[" * 100_000 + "]" * 100_000
# PostgreSQL prints jsonb numbers in full, never with an exponent: 1e5000 comes back as
# 5,001 digits, more than Python converts to an int.
HUGE_INTEGER = '{"n": 1' + "0" * 5000 + "}"
# A number past a float's range, which Python would read as Infinity.
PAST_FLOAT_RANGE = '{"x": 1' + "0" * 400 + ".5}"

UNDECODABLE = {
    "too deep": (TOO_DEEP, "nested more deeply"),
    # Python loads it, but neither pgqueue nor the API's JSON encoder would write it.
    "deeper than pgqueue stores": (
        "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1),
        f"nested more than {MAX_DEPTH} levels deep",
    ),
    "huge integer": (HUGE_INTEGER, "more than 4300 digits"),
    "past float range": (PAST_FLOAT_RANGE, "too large for a float"),
    "NaN": ('{"x": NaN}', "NaN is not a JSON number"),
    "Infinity": ('{"x": -Infinity}', "-Infinity is not a JSON number"),
    "lone surrogate escape": ('{"s": "\\ud800"}', "lone UTF-16 surrogate"),
    "not JSON": ('{"s": ', "not JSON"),
}


def test_texts_load_in_order_with_none_kept_in_place():
    texts = ['{"seq": 1}', None, "[1, 2.5, null]", '"text"', "true"]
    assert load_json_texts(texts) == [{"seq": 1}, None, [1, 2.5, None], "text", True]


@pytest.mark.parametrize("kind", sorted(UNDECODABLE))
def test_a_value_python_cannot_load_faithfully_spoils_only_itself(kind):
    text, reason = UNDECODABLE[kind]
    loaded = load_json_texts(['{"a": 1}', text, None, '{"b": 2}'])
    assert loaded[0] == {"a": 1} and loaded[2] is None and loaded[3] == {"b": 2}
    assert isinstance(loaded[1], UndecodableJson)
    assert loaded[1] == text and reason in loaded[1].reason
    # Alone, as text or as the bytes psycopg's jsonb loader is given, it is the same.
    for data in (text, text.encode()):
        alone = load_json(data)
        assert isinstance(alone, UndecodableJson) and alone.reason == loaded[1].reason


def test_a_surrogate_pair_is_one_character_and_loads():
    assert load_json('"\\ud83d\\ude00"') == "\U0001f600"
    assert load_json_texts(['{"s": "\\ud83d\\ude00"}']) == [{"s": "\U0001f600"}]
    # An escaped backslash before "ud800" is text, not an escape.
    assert load_json('"\\\\ud800"') == "\\ud800"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b'{"s": "\xed\xa0\x80"}', "not valid UTF-8"),  # a lone surrogate, UTF-8 encoded
        (b'{"s": "\xff"}', "not valid UTF-8"),
    ],
)
def test_bytes_that_are_not_utf8_are_undecodable_and_shown_as_utf8(data, reason):
    """A database whose encoding is SQL_ASCII stores such bytes in jsonb; Python's json
    module would read the first as a string holding a lone surrogate, which no JSON
    encoder can write back as UTF-8."""
    loaded = load_json(data)
    assert isinstance(loaded, UndecodableJson) and reason in loaded.reason
    # What is shown of it can always be written out.
    json.dumps(loaded, ensure_ascii=False).encode("utf-8")
    assert loaded.startswith('{"s": "')


def test_no_texts_load_as_no_values():
    assert load_json_texts([]) == []


def test_an_undecodable_value_copies_and_pickles_with_its_reason():
    value = load_json(HUGE_INTEGER)
    for again in (copy.copy(value), copy.deepcopy(value), pickle.loads(pickle.dumps(value))):
        assert isinstance(again, UndecodableJson)
        assert (again, again.reason) == (value, value.reason)


def test_as_deep_as_pgqueue_stores_and_wide_values_load():
    deepest = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    wide = '{"rows": [' + ",".join(['{"n": [1]}'] * MAX_DEPTH * 2) + "]}"
    for loaded in (load_json_texts([deepest, wide]), [load_json(deepest), load_json(wide)]):
        assert not any(isinstance(value, UndecodableJson) for value in loaded)
        assert loaded[1] == json.loads(wide)
    # Many small values whose brackets add up past the limit all load.
    many = [f'{{"n": [{n}]}}' for n in range(MAX_DEPTH * 2)]
    assert load_json_texts(many) == [{"n": [n]} for n in range(MAX_DEPTH * 2)]
