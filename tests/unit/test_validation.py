from datetime import UTC, datetime

import pytest

from pgqueue import JobSpec, ValidationError
from pgqueue.validation import jsonb_text


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
