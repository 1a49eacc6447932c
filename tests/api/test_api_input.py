"""Client mistakes are 422 naming the field, never 5xx, and nothing is stored."""

from __future__ import annotations

import json

import httpx
import pytest
from psycopg import sql

JSON = {"content-type": "application/json"}


@pytest.fixture
def api(module_api: httpx.Client) -> httpx.Client:
    """Every request here is refused, so one API on one schema serves the whole module."""
    return module_api


@pytest.fixture(autouse=True)
def _nothing_is_stored(db, module_schema):
    yield
    count = sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(module_schema))
    assert db.execute(count).fetchone()[0] == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"task": 7}, "task"),
        ({"task": "echo", "payload": [1, 2]}, "payload"),
        ({"task": "echo", "payload": "text"}, "payload"),
        ({"task": "echo", "priority": "5"}, "priority"),
        ({"task": "echo", "priority": 1.5}, "priority"),
        ({"task": "echo", "priority": True}, "priority"),
        ({"task": "echo", "priority": 1001}, "priority"),
        ({"task": "echo", "priority": -1001}, "priority"),
        ({"task": "echo", "max_attempts": 0}, "max_attempts"),
        ({"task": "echo", "colour": "blue"}, "colour"),
        ({"payload": {}}, "task"),
        ({"task": ""}, "task"),
        ({"task": "x" * 129}, "task"),
        ({"task": "bad name"}, "task"),
        ({"task": "echo\n"}, "task"),
        ({"task": "echo", "queue": ""}, "queue"),
        ({"task": "echo", "queue": "q" * 129}, "queue"),
        ({"task": "echo", "delay_seconds": -1}, "delay_seconds"),
        ({"task": "echo", "delay_seconds": 1e12}, "delay_seconds"),
        ({"task": "echo", "delay_seconds": "10"}, "delay_seconds"),
        ({"task": "echo", "timeout_seconds": 0}, "timeout_seconds"),
        ({"task": "echo", "run_at": "2030-01-01T00:00:00"}, "run_at"),
        ({"task": "echo", "run_at": 1700000000}, "run_at"),
        ({"task": "echo", "run_at": "0001-01-01T00:00:00+14:00"}, "run_at"),
        ({"task": "echo", "run_at": "yesterday"}, "run_at"),
        (
            {"task": "echo", "delay_seconds": 5, "run_at": "2030-01-01T00:00:00Z"},
            "delay_seconds",
        ),
        ({"task": "echo", "payload": {"text": "a\u0000b"}}, "payload"),
        ({"task": "echo", "payload": {"deep": [{"x\u0000": 1}]}}, "payload"),
        ({"task": "echo", "idempotency_key": ""}, "idempotency_key"),
        ({"task": "echo", "idempotency_key": "k\u0000"}, "idempotency_key"),
        ({"task": "echo", "idempotency_key": "k" * 256}, "idempotency_key"),
    ],
)
def test_invalid_job_is_422_naming_the_field(api: httpx.Client, body, field):
    response = api.post("/jobs", json=body)
    assert response.status_code == 422, response.text
    error = response.json()
    assert error["errors"][0]["field"] == field
    assert error["detail"].startswith(f"{field}: ")


@pytest.mark.parametrize(
    "raw",
    [
        b'{"task": "echo", "payload": {"x": NaN}}',
        b'{"task": "echo", "payload": {"x": Infinity}}',
        b'{"task": "echo", "payload": {"x": -Infinity}}',
        b'{"task": "echo", "payload": {"x": 1e999}}',
        b'{"task": "echo", "delay_seconds": NaN}',
        b'{"task": "echo", "payload": {"x": "\\ud800"}}',
        b'{"task": "echo", "payload": {"\\udfff": 1}}',
        b'{"task": "echo", "payload": {"x": 1' + b"0" * 5000 + b"}}",
        b'{"task": "echo", "payload": {"x": "\xff"}}',
        b'{"task": "echo", "payload": {"x": "a\x00b"}}',
        b'{"task": "echo",',
        b"",
        b"[" * 100_000,
        b"\x00",
    ],
)
def test_malformed_json_is_422_with_a_renderable_error(api: httpx.Client, raw: bytes):
    response = api.post("/jobs", content=raw, headers=JSON)
    assert response.status_code == 422, response.text
    error = json.loads(response.content.decode("ascii"))
    assert error["errors"][0]["field"] == "body"


def test_valid_surrogate_pairs_are_fine_in_payloads(api: httpx.Client, db, module_schema):
    raw = b'{"task": "echo", "payload": {"smile": "\\ud83d\\ude00"}}'
    response = api.post("/jobs", content=raw, headers=JSON)
    assert response.status_code == 201
    assert response.json()["payload"] == {"smile": "\U0001f600"}
    db.execute(sql.SQL("DELETE FROM {}.active_jobs").format(sql.Identifier(module_schema)))


def test_body_that_is_not_a_json_object_is_422(api: httpx.Client):
    for raw in (b"[]", b'"echo"', b"42", b"null"):
        response = api.post("/jobs", content=raw, headers=JSON)
        assert response.status_code == 422, raw


def test_body_without_json_content_type_is_422_saying_so(api: httpx.Client):
    response = api.post(
        "/jobs", content=b'{"task": "echo"}', headers={"content-type": "text/plain"}
    )
    assert response.status_code == 422
    assert "application/json" in response.json()["detail"]


def test_unknown_field_names_that_are_not_unicode_still_render(api: httpx.Client):
    # Reaches the schema check only if the lone-surrogate guard is bypassed; either way
    # the answer must be a 422 with an ASCII-renderable body.
    response = api.post("/jobs", content=b'{"task": "echo", "\\ud800x": 1}', headers=JSON)
    assert response.status_code == 422
    json.loads(response.content.decode("ascii"))


def test_batch_item_errors_name_the_item(api: httpx.Client):
    response = api.post(
        "/jobs/batch", json={"jobs": [{"task": "echo"}, {"task": "echo", "priority": 5000}]}
    )
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "jobs[1].priority"
    both = api.post(
        "/jobs/batch",
        json={
            "jobs": [
                {"task": "echo"},
                {"task": "echo", "delay_seconds": 1, "run_at": "2030-01-01T00:00:00Z"},
            ]
        },
    )
    assert both.json()["errors"][0]["field"] == "jobs[1].delay_seconds"
