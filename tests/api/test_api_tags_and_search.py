"""Tags and payload search through the API: tags on every path of enqueue, answered as a
list in every job body, and ``GET /jobs?tag=`` and ``?payload_contains=`` returning
exactly the matching jobs, queued, running or finished, with 422 for bad input."""

from __future__ import annotations

import json

import httpx

from pgqueue import Queue


def _ids(answer: httpx.Response) -> list[int]:
    assert answer.status_code == 200, answer.text
    return [job["id"] for job in answer.json()["jobs"]]


def test_tags_are_kept_on_every_enqueue_path_and_answered_as_lists(
    api: httpx.Client, queue: Queue
) -> None:
    one = api.post("/jobs", json={"task": "t", "tags": ["a", "b", "a"]})
    assert one.status_code == 201 and one.json()["tags"] == ["a", "b"]
    plain = api.post("/jobs", json={"task": "t"}).json()
    assert plain["tags"] == [] and plain["progress"] is None
    keyed = api.post("/jobs", json={"task": "t", "tags": ["k"], "unique_key": "u1"})
    assert keyed.json()["tags"] == ["k"]
    # A small batch (one INSERT over arrays) and a large one (COPY), mixed with untagged.
    for size in (3, 60):
        items = [
            {"task": "t", "tags": [f"n{i}", "batch"]} if i % 2 else {"task": "t"}
            for i in range(size)
        ]
        created = api.post("/jobs/batch", json={"jobs": items})
        assert created.status_code == 201, created.text
        tags = [item["job"]["tags"] for item in created.json()["items"]]
        assert tags == [[f"n{i}", "batch"] if i % 2 else [] for i in range(size)]
        stored = [queue.get(item["job"]["id"]).tags for item in created.json()["items"]]
        assert stored == tags
    dependent = api.post(
        "/jobs", json={"task": "t", "tags": ["d"], "depends_on": [one.json()["id"]]}
    ).json()
    assert dependent["tags"] == ["d"] and dependent["state"] == "waiting"
    assert api.get(f"/jobs/{one.json()['id']}").json()["tags"] == ["a", "b"]
    # Tags go with the job to history and back.
    cancelled = api.post(f"/jobs/{one.json()['id']}/cancel").json()
    assert cancelled["tags"] == ["a", "b"]
    # Its dependent was cancelled with it, tags and all.
    assert api.get(f"/jobs/{dependent['id']}").json()["tags"] == ["d"]
    assert api.post(f"/jobs/{one.json()['id']}/retry").json()["tags"] == ["a", "b"]


def test_tag_filters_return_exactly_the_jobs_with_all_given_tags(
    api: httpx.Client, queue: Queue
) -> None:
    red = api.post("/jobs", json={"task": "t", "tags": ["red"]}).json()["id"]
    both = api.post("/jobs", json={"task": "t", "tags": ["red", "big"]}).json()["id"]
    big = api.post("/jobs", json={"task": "t", "tags": ["big"]}).json()["id"]
    api.post("/jobs", json={"task": "t"})
    done = api.post("/jobs", json={"task": "t", "tags": ["red"]}).json()["id"]
    api.post(f"/jobs/{done}/cancel")
    assert _ids(api.get("/jobs", params={"tag": "red"})) == [done, both, red]
    assert _ids(api.get("/jobs", params=[("tag", "red"), ("tag", "big")])) == [both]
    assert _ids(api.get("/jobs", params={"tag": "big"})) == [big, both]
    assert _ids(api.get("/jobs", params={"tag": "red", "state": "queued"})) == [both, red]
    assert _ids(api.get("/jobs", params={"tag": "red", "state": "cancelled"})) == [done]
    assert _ids(api.get("/jobs", params={"tag": "none"})) == []
    page = api.get("/jobs", params={"tag": "red", "limit": 2}).json()
    assert [j["id"] for j in page["jobs"]] == [done, both] and page["next_after"] == both
    rest = api.get("/jobs", params={"tag": "red", "limit": 2, "after": page["next_after"]})
    assert _ids(rest) == [red]


def test_payload_containment_returns_exactly_the_matching_jobs(api: httpx.Client) -> None:
    payloads = [
        {"customer": 7, "kind": "invoice"},
        {"customer": 7, "kind": "refund", "lines": [1, 2]},
        {"customer": 8, "kind": "invoice"},
        {"nested": {"customer": 7}},
        {"customer": "7"},
    ]
    ids = [api.post("/jobs", json={"task": "t", "payload": p}).json()["id"] for p in payloads]
    api.post(f"/jobs/{ids[1]}/cancel")

    def found(filter_: object) -> list[int]:
        return _ids(api.get("/jobs", params={"payload_contains": json.dumps(filter_)}))

    assert found({"customer": 7}) == [ids[1], ids[0]]
    assert found({"customer": 7, "kind": "invoice"}) == [ids[0]]
    assert found({"lines": [2]}) == [ids[1]]
    assert found({"nested": {"customer": 7}}) == [ids[3]]
    assert found({"customer": "7"}) == [ids[4]]
    assert found({"customer": 9}) == []
    combined = api.get("/jobs", params={"payload_contains": '{"customer": 7}', "state": "queued"})
    assert _ids(combined) == [ids[0]]


def test_bad_tags_and_filters_are_refused_with_422(api: httpx.Client) -> None:
    for tags in (["x" * 65], [""], [f"t{i}" for i in range(17)], "single", [1]):
        answer = api.post("/jobs", json={"task": "t", "tags": tags})
        assert answer.status_code == 422, (tags, answer.text)
        assert answer.json()["errors"][0]["field"].startswith("tags")
    bad_batch = api.post("/jobs/batch", json={"jobs": [{"task": "t"}, {"task": "t", "tags": [""]}]})
    assert bad_batch.status_code == 422
    for value in ("{not json", "[1, 2]", "3", '"text"'):
        answer = api.get("/jobs", params={"payload_contains": value})
        assert answer.status_code == 422, (value, answer.text)
        assert "payload_contains" in answer.text
    assert api.get("/jobs", params={"tag": "x" * 65}).status_code == 422
