import json
from datetime import UTC, datetime

import pytest

from pgqueue import JobSpec, ValidationError
from pgqueue.validation import MAX_DEPTH, jsonb_text


def field_of(**kwargs) -> str:
    with pytest.raises(ValidationError) as info:
        JobSpec(**{"task": "t", **kwargs})
    assert isinstance(info.value, ValueError)
    return info.value.field


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"task": ""}, "task"),
        ({"task": "x" * 129}, "task"),
        ({"task": "has space"}, "task"),
        ({"task": "echo\n"}, "task"),
        ({"queue": ""}, "queue"),
        ({"queue": "-leading"}, "queue"),
        ({"priority": 1001}, "priority"),
        ({"priority": True}, "priority"),
        ({"priority": "1"}, "priority"),
        ({"payload": [1, 2]}, "payload"),
        ({"payload": {"a": "\x00"}}, "payload"),
        ({"payload": {"\x00": 1}}, "payload"),
        ({"payload": {"a": float("nan")}}, "payload"),
        ({"payload": {"a": float("inf")}}, "payload"),
        ({"payload": {"a": object()}}, "payload"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"delay_seconds": -1}, "delay_seconds"),
        ({"delay_seconds": float("inf")}, "delay_seconds"),
        ({"delay_seconds": 1e300}, "delay_seconds"),
        ({"run_at": datetime(2030, 1, 1)}, "run_at"),
        ({"run_at": datetime(1, 1, 1, tzinfo=UTC)}, "run_at"),
        (
            {"delay_seconds": 1, "run_at": datetime(2030, 1, 1, tzinfo=UTC)},
            "delay_seconds",
        ),
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"idempotency_key": "k" * 256}, "idempotency_key"),
        ({"timeout_seconds": 0}, "timeout_seconds"),
    ],
)
def test_bad_job_fields_are_refused_naming_the_field(kwargs, field):
    assert field_of(**kwargs) == field


def test_a_valid_job_spec_is_accepted():
    spec = JobSpec(
        "send.email",
        {"to": "a@example.com", "n": [1, 2.5, None]},
        queue="mail:eu-1",
        priority=-1000,
        run_at=datetime(2030, 1, 1, tzinfo=UTC),
        idempotency_key="order-42",
        max_attempts=1,
        timeout_seconds=0.5,
    )
    assert spec.params()["payload"] == '{"to":"a@example.com","n":[1,2.5,null]}'


def test_results_with_nul_in_nested_keys_are_refused():
    with pytest.raises(ValidationError, match="NUL"):
        jsonb_text("result", {"outer": [{"in\x00ner": 1}]})


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def test_nesting_is_refused_past_max_depth_and_accepted_up_to_it():
    assert jsonb_text("payload", _nested(MAX_DEPTH)).count("{") == MAX_DEPTH
    with pytest.raises(ValidationError, match="nested too deeply"):
        jsonb_text("payload", _nested(MAX_DEPTH + 1))
    # Deeper than Python's own recursion limit: the same clear refusal.
    with pytest.raises(ValidationError, match="nested too deeply"):
        jsonb_text("payload", _nested(5000))


def test_values_that_only_look_suspicious_in_their_text_are_accepted():
    # Text that contains the escape of a NUL without holding one (a backslash, then
    # u0000), and more brackets than MAX_DEPTH side by side, are checked on the value.
    assert jsonb_text("payload", {"path": "C:\\u0000"}) == '{"path":"C:\\\\u0000"}'
    wide = {"items": [{"n": n} for n in range(MAX_DEPTH * 2)]}
    assert json.loads(jsonb_text("payload", wide)) == wide


def test_a_nul_anywhere_is_refused_whatever_else_the_value_holds():
    for value in ({"a": [1, {"b": "x\x00"}]}, {"a": "\x00", "b": float("nan")}, ["\x00"] * 300):
        with pytest.raises(ValidationError, match="NUL"):
            jsonb_text("payload", value)
