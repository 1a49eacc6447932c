"""Loading many jsonb texts at once, and what happens to one Python cannot load."""

from pgqueue.jsonb import UndecodableJson, load_json_texts

TOO_DEEP = "[" * 100_000 + "]" * 100_000


def test_texts_load_in_order_with_none_kept_in_place():
    texts = ['{"seq": 1}', None, "[1, 2.5, null]", '"text"', "true"]
    assert load_json_texts(texts) == [{"seq": 1}, None, [1, 2.5, None], "text", True]


def test_a_value_too_deep_for_python_spoils_only_itself():
    loaded = load_json_texts(['{"a": 1}', TOO_DEEP, None, '{"b": 2}'])
    assert loaded[0] == {"a": 1} and loaded[2] is None and loaded[3] == {"b": 2}
    assert isinstance(loaded[1], UndecodableJson)
    assert loaded[1] == TOO_DEEP and "nested more deeply" in loaded[1].reason


def test_no_texts_load_as_no_values():
    assert load_json_texts([]) == []
