"""The payload limit over HTTP: the API's body limit leaves room for any payload the
queue takes, and a payload over the queue's limit is a 422 naming both sizes."""

from __future__ import annotations

import httpx

from pgqueue.validation import PAYLOAD_MAX_BYTES

# {"data":"..."} around the string.
ENVELOPE = len('{"data":""}')


def payload_of(size: int) -> dict[str, str]:
    """A payload whose JSON text is ``size`` bytes."""
    return {"data": "p" * (size - ENVELOPE)}


def test_a_payload_at_the_limit_is_accepted(api: httpx.Client) -> None:
    response = api.post("/jobs", json={"task": "echo", "payload": payload_of(PAYLOAD_MAX_BYTES)})
    assert response.status_code == 201, response.text
    assert len(response.json()["payload"]["data"]) == PAYLOAD_MAX_BYTES - ENVELOPE


def test_a_payload_over_the_limit_is_422_with_both_sizes(api: httpx.Client) -> None:
    size = PAYLOAD_MAX_BYTES + 1
    response = api.post("/jobs", json={"task": "echo", "payload": payload_of(size)})
    assert response.status_code == 422, response.text
    assert response.json()["errors"] == [
        {"field": "payload", "message": f"is {size} bytes, over the limit of {PAYLOAD_MAX_BYTES}"}
    ]
    assert api.get("/jobs").json()["jobs"] == []


def test_a_batch_with_a_payload_over_the_limit_names_the_item_and_adds_nothing(
    api: httpx.Client,
) -> None:
    jobs = [
        {"task": "echo", "payload": {"n": 0}},
        {"task": "echo", "payload": payload_of(PAYLOAD_MAX_BYTES + 5)},
    ]
    response = api.post("/jobs/batch", json={"jobs": jobs})
    assert response.status_code == 422, response.text
    [error] = response.json()["errors"]
    assert error["field"] == "jobs[1].payload"
    assert error["message"].startswith(f"is {PAYLOAD_MAX_BYTES + 5} bytes")
    assert api.get("/jobs").json()["jobs"] == []
