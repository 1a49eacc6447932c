"""POST /jobs's common case (one job, no keys, no dependencies), which the API serves
before FastAPI's routing, answers exactly as the route does; everything else still
reaches the route."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import psycopg
from psycopg import sql

# Only the media type decides which way a request goes: FastAPI reads a "+json" body
# as JSON too, and that one goes through the route.
JSON = {"content-type": "application/json"}
ROUTED_JSON = {"content-type": "application/vnd.pgqueue+json"}
SERVER_CHOSEN = ("id", "enqueued_at", "run_at")


def _job_rows(db: psycopg.Connection, schema: str) -> list[tuple[object, ...]]:
    query = sql.SQL("SELECT task, queue, payload, priority, tags FROM {}.jobs ORDER BY id")
    return db.execute(query.format(sql.Identifier(schema))).fetchall()


def test_the_common_case_answers_as_the_route_does(api: httpx.Client, db, schema):
    body = (
        b'{"task": "mail.send", "payload": {"to": "a@example.com", "n": [1, 2.5, null]},'
        b' "queue": "mail", "priority": 3, "tags": ["x", "x", "y"], "delay_seconds": 60.0,'
        b' "max_attempts": 2, "timeout_seconds": 9.5, "partition_key": "tenant-1"}'
    )
    fast = api.post("/jobs", content=body, headers=JSON)
    routed = api.post("/jobs", content=body, headers=ROUTED_JSON)

    assert fast.status_code == routed.status_code == 201
    assert fast.headers["content-type"] == routed.headers["content-type"]
    assert "x-request-id" in fast.headers
    fast_job, routed_job = fast.json(), routed.json()
    assert fast_job["id"] != routed_job["id"]
    for name in SERVER_CHOSEN:
        del fast_job[name], routed_job[name]
    assert fast_job == routed_job
    assert fast_job["tags"] == ["x", "y"] and fast_job["state"] == "queued"
    first, second = _job_rows(db, schema)
    assert first == second


def test_a_body_sent_in_chunks_is_read_whole(api: httpx.Client, db, schema):
    def chunks() -> Iterator[bytes]:
        yield b'{"task": "echo", '
        yield b'"payload": {"part": "'
        yield b"x" * 10_000
        yield b'"}}'

    answer = api.post("/jobs", content=chunks(), headers=JSON)

    assert answer.status_code == 201, answer.text
    assert answer.json()["payload"] == {"part": "x" * 10_000}
    assert len(_job_rows(db, schema)) == 1


def test_bad_input_gets_the_routes_answer(api: httpx.Client, db, schema):
    for body in (
        b'{"task": "echo", "payload": {"n": NaN}}',
        b'{"task": "echo", "payload": {"n": 1}',
        b'{"task": "no spaces allowed"}',
        b'{"task": "echo", "surprise": 1}',
        b'{"task": "echo", "delay_seconds": 1.0, "run_at": "2030-01-01T00:00:00Z"}',
        b'{"task": "echo", "payload": {"s": "nul \\u0000 here"}}',
        b"[]",
        b"",
    ):
        fast = api.post("/jobs", content=body, headers=JSON)
        routed = api.post("/jobs", content=body, headers=ROUTED_JSON)
        assert fast.status_code == routed.status_code == 422, (body, fast.text)
        assert fast.json() == routed.json(), body
    assert _job_rows(db, schema) == []


def test_jobs_with_keys_or_dependencies_are_enqueued_by_the_route(api: httpx.Client):
    first = api.post("/jobs", json={"task": "echo", "idempotency_key": "k"})
    again = api.post("/jobs", json={"task": "echo", "idempotency_key": "k"})
    conflict = api.post("/jobs", json={"task": "other", "idempotency_key": "k"})
    held = api.post("/jobs", json={"task": "echo", "unique_key": "u"})
    same = api.post("/jobs", json={"task": "echo", "unique_key": "u"})
    unknown = api.post("/jobs", json={"task": "echo", "depends_on": [10**12]})

    assert (first.status_code, again.status_code, conflict.status_code) == (201, 200, 409)
    assert again.json()["id"] == first.json()["id"]
    assert (held.status_code, same.status_code) == (201, 200)
    assert same.json()["id"] == held.json()["id"]
    assert unknown.status_code == 422
    assert unknown.json()["errors"][0]["field"] == "depends_on"


def test_without_a_token_the_common_case_is_refused_before_anything_is_stored(
    start_api, db, schema
):
    running = start_api(tokens=frozenset({"secret"}))

    refused = running.client.post("/jobs", json={"task": "echo"})
    accepted = running.client.post(
        "/jobs", json={"task": "echo"}, headers={"Authorization": "Bearer secret"}
    )

    assert refused.status_code == 401
    assert accepted.status_code == 201
    assert len(_job_rows(db, schema)) == 1
