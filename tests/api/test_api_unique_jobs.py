"""The API's side of unique jobs: 201 for the job created, 200 with the holder while a
queued or running job holds the key, the batch's ``created`` flags, ``unique_key`` in
job bodies, 422 for a bad key, and 409 for a retry whose key another job holds."""

from __future__ import annotations

import httpx
import pytest
from psycopg import sql

from pgqueue import Queue


def test_a_held_key_answers_200_with_its_job_until_the_job_finishes(
    api: httpx.Client, queue: Queue
) -> None:
    first = api.post("/jobs", json={"task": "sync", "payload": {"n": 1}, "unique_key": "u"})
    assert first.status_code == 201 and first.json()["unique_key"] == "u"
    again = api.post("/jobs", json={"task": "other", "payload": {"n": 2}, "unique_key": "u"})
    assert again.status_code == 200 and again.json() == first.json()
    shown = api.get(f"/jobs/{first.json()['id']}").json()
    assert shown["unique_key"] == "u" and shown["state"] == "queued"
    cancelled = api.post(f"/jobs/{first.json()['id']}/cancel")
    assert cancelled.json()["unique_key"] == "u"
    fresh = api.post("/jobs", json={"task": "sync", "unique_key": "u"})
    assert fresh.status_code == 201 and fresh.json()["id"] != first.json()["id"]
    # The cancelled job cannot come back while the new one holds the key.
    refused = api.post(f"/jobs/{first.json()['id']}/retry")
    assert refused.status_code == 409
    assert f"held by job {fresh.json()['id']}" in refused.json()["detail"]
    assert queue.get(first.json()["id"]).state.value == "cancelled"
    assert api.post("/jobs", json={"task": "plain"}).json()["unique_key"] is None


def test_a_batch_says_which_items_were_created(api: httpx.Client, db, schema) -> None:
    held = api.post("/jobs", json={"task": "sync", "unique_key": "held"}).json()
    jobs = [
        {"task": "sync", "unique_key": "held"},
        {"task": "sync", "unique_key": "new"},
        {"task": "other", "unique_key": "new"},
        {"task": "plain"},
        {"task": "sync", "idempotency_key": "r", "unique_key": "held"},
    ]
    response = api.post("/jobs/batch", json={"jobs": jobs})
    assert response.status_code == 201, response.text
    items = response.json()["items"]
    assert [item["created"] for item in items] == [False, True, False, True, False]
    assert items[0]["job"]["id"] == held["id"] == items[4]["job"]["id"]
    assert items[1]["job"] == items[2]["job"] and items[1]["job"]["unique_key"] == "new"
    count = sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(schema))
    assert db.execute(count).fetchone()[0] == 3
    # The turned-away item's idempotency key was not recorded.
    assert api.post("/jobs", json={"task": "mail", "idempotency_key": "r"}).status_code == 201


@pytest.mark.parametrize(
    ("job", "field"),
    [
        ({"task": "t", "unique_key": ""}, "unique_key"),
        ({"task": "t", "unique_key": "x" * 256}, "unique_key"),
        ({"task": "t", "unique_key": "a\u0000b"}, "unique_key"),
        ({"task": "t", "unique_key": 5}, "unique_key"),
    ],
)
def test_a_bad_unique_key_is_422_naming_the_field(
    api: httpx.Client, db, schema, job: dict, field: str
) -> None:
    one = api.post("/jobs", json=job)
    assert one.status_code == 422, one.text
    assert one.json()["errors"][0]["field"] == field
    batch = api.post("/jobs/batch", json={"jobs": [{"task": "ok"}, job]})
    assert batch.status_code == 422, batch.text
    assert batch.json()["errors"][0]["field"] == f"jobs[1].{field}"
    count = sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(schema))
    assert db.execute(count).fetchone()[0] == 0


def test_the_openapi_document_describes_unique_key(api: httpx.Client) -> None:
    schemas = api.get("/openapi.json").json()["components"]["schemas"]
    assert "unique_key" in schemas["JobCreate"]["properties"]
    assert "unique_key" in schemas["Job"]["required"]
