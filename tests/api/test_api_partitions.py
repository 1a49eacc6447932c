"""Flow control through the API: a job's ``partition_key`` on every enqueue path and in
every job body, ``GET /jobs?partition_key=``, the queue's partition limits and throttle
in ``PATCH``/``GET /queues``, ``GET /queues/{name}/partitions`` paged busiest first, and
the ``pgqueue_throttled_partitions`` gauge; bad input is 422 naming the field."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pgqueue import Queue, WorkerProtocol


def _queues(api: httpx.Client) -> dict[str, dict]:
    return {q["queue"]: q for q in api.get("/queues").json()["queues"]}


def test_the_key_is_kept_on_every_enqueue_path_and_filters_the_listing(
    api: httpx.Client, queue: Queue
) -> None:
    one = api.post("/jobs", json={"task": "t", "partition_key": "tenant-1"})
    assert one.status_code == 201, one.text
    assert one.json()["partition_key"] == "tenant-1"
    plain = api.post("/jobs", json={"task": "t"}).json()
    assert plain["partition_key"] is None
    batch = api.post(
        "/jobs/batch",
        json={
            "jobs": [
                {"task": "t", "partition_key": "tenant-2"},
                {"task": "t"},
                {"task": "t", "partition_key": "tenant-1"},
            ]
        },
    )
    assert batch.status_code == 201, batch.text
    keys = [item["job"]["partition_key"] for item in batch.json()["items"]]
    assert keys == ["tenant-2", None, "tenant-1"]
    assert [queue.get(item["job"]["id"]).partition_key for item in batch.json()["items"]] == keys
    assert api.get(f"/jobs/{one.json()['id']}").json()["partition_key"] == "tenant-1"

    listed = api.get("/jobs", params={"partition_key": "tenant-1"})
    assert listed.status_code == 200, listed.text
    tenant_1 = [one.json()["id"], batch.json()["items"][2]["job"]["id"]]
    assert [job["id"] for job in listed.json()["jobs"]] == sorted(tenant_1, reverse=True)
    assert {job["partition_key"] for job in api.get("/jobs").json()["jobs"]} == {
        "tenant-1",
        "tenant-2",
        None,
    }
    # The key goes with the job to history and back.
    cancelled = api.post(f"/jobs/{one.json()['id']}/cancel").json()
    assert cancelled["partition_key"] == "tenant-1"
    assert api.post(f"/jobs/{one.json()['id']}/retry").json()["partition_key"] == "tenant-1"


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "at least 1 character"),
        ("k" * 201, "at most 200 characters"),
        (7, "valid string"),
        (["a"], "valid string"),
    ],
)
def test_a_bad_key_is_422_naming_it_and_nothing_is_enqueued(
    api: httpx.Client, queue: Queue, key: object, message: str
) -> None:
    answer = api.post("/jobs", json={"task": "t", "partition_key": key})
    assert answer.status_code == 422, answer.text
    [error] = answer.json()["errors"]
    assert error["field"] == "partition_key"
    assert message in error["message"]
    batch = api.post(
        "/jobs/batch", json={"jobs": [{"task": "t"}, {"task": "t", "partition_key": key}]}
    )
    assert batch.status_code == 422, batch.text
    assert [error["field"] for error in batch.json()["errors"]] == ["jobs[1].partition_key"]
    assert api.get("/jobs", params={"partition_key": "k" * 201}).status_code == 422
    assert queue.stats() == []


def test_a_key_of_200_characters_is_accepted(api: httpx.Client) -> None:
    answer = api.post("/jobs", json={"task": "t", "partition_key": "é" * 200})
    assert answer.status_code == 201, answer.text
    assert answer.json()["partition_key"] == "é" * 200


def test_partition_limits_are_set_cleared_and_shown(api: httpx.Client, queue: Queue) -> None:
    queue.enqueue("t", queue="mail")
    mail = _queues(api)["mail"]
    assert (
        mail["partition_concurrency_limit"],
        mail["partition_rate_limit"],
        mail["throttled_until"],
    ) == (None, None, None)

    answer = api.patch(
        "/queues/mail", json={"partition_concurrency_limit": 2, "partition_rate_limit": 0.5}
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["partition_concurrency_limit"], body["partition_rate_limit"]) == (2, 0.5)
    assert (body["concurrency_limit"], body["rate_limit"], body["paused"]) == (None, None, False)
    one = api.get("/queues/mail")
    assert one.status_code == 200, one.text
    listed = _queues(api)["mail"]
    # The same body as in the list (but for the age, which grows between the two reads).
    assert one.json().keys() == listed.keys()
    assert {k: v for k, v in one.json().items() if k != "oldest_runnable_age_seconds"} == {
        k: v for k, v in listed.items() if k != "oldest_runnable_age_seconds"
    }
    assert (one.json()["partition_concurrency_limit"], one.json()["partition_rate_limit"]) == (
        2,
        0.5,
    )
    # null clears one; the other stays.
    cleared = api.patch("/queues/mail", json={"partition_rate_limit": None}).json()
    assert (cleared["partition_concurrency_limit"], cleared["partition_rate_limit"]) == (2, None)
    info = queue.update_queue("mail")
    assert (info.partition_concurrency_limit, info.partition_rate_limit) == (2, None)


def test_a_queue_throttle_shows_until_when(api: httpx.Client, queue: Queue) -> None:
    queue.enqueue("t", queue="mail")
    before = datetime.now(UTC)
    queue.throttle("mail", 600)
    until = datetime.fromisoformat(api.get("/queues/mail").json()["throttled_until"])
    assert until == datetime.fromisoformat(_queues(api)["mail"]["throttled_until"])
    assert 590 < (until - before).total_seconds() < 700


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"partition_concurrency_limit": -1}, "partition_concurrency_limit"),
        ({"partition_concurrency_limit": 1.5}, "partition_concurrency_limit"),
        ({"partition_concurrency_limit": "2"}, "partition_concurrency_limit"),
        ({"partition_rate_limit": 0}, "partition_rate_limit"),
        ({"partition_rate_limit": -1}, "partition_rate_limit"),
        ({"partition_rate_limit": 1e12}, "partition_rate_limit"),
        ({"partition_rate_limit": "5"}, "partition_rate_limit"),
    ],
)
def test_bad_partition_limits_are_422_naming_the_field(
    api: httpx.Client, queue: Queue, body: dict, field: str
) -> None:
    queue.enqueue("t")
    answer = api.patch("/queues/default", json=body)
    assert answer.status_code == 422, answer.text
    assert [error["field"] for error in answer.json()["errors"]] == [field]
    default = _queues(api)["default"]
    assert (default["partition_concurrency_limit"], default["partition_rate_limit"]) == (
        None,
        None,
    )


def test_partitions_are_listed_busiest_first_a_page_at_a_time(
    api: httpx.Client, queue: Queue
) -> None:
    for key, jobs in (("small", 1), ("big", 4), ("mid", 2), ("also-mid", 2)):
        for _ in range(jobs):
            queue.enqueue("t", queue="work", partition_key=key)
    queue.enqueue("t", queue="work")  # no key: not a partition
    queue.throttle("work", 300, partition_key="small")

    first = api.get("/queues/work/partitions", params={"limit": 2})
    assert first.status_code == 200, first.text
    page = first.json()
    # Ties (mid and also-mid) in key order.
    assert [p["partition_key"] for p in page["partitions"]] == ["big", "also-mid"]
    assert page["partitions"][0] == {
        "partition_key": "big",
        "queued": 4,
        "running": 0,
        "throttled_until": None,
    }
    assert page["next_after"] is not None
    second = api.get(
        "/queues/work/partitions", params={"limit": 2, "after": page["next_after"]}
    ).json()
    assert [p["partition_key"] for p in second["partitions"]] == ["mid", "small"]
    if second["next_after"] is not None:
        rest = api.get("/queues/work/partitions", params={"after": second["next_after"]})
        assert rest.json() == {"partitions": [], "next_after": None}
    small = second["partitions"][1]
    assert (small["queued"], small["running"]) == (1, 0)
    assert datetime.fromisoformat(small["throttled_until"]) > datetime.now(UTC)
    everything = api.get("/queues/work/partitions").json()
    assert [p["partition_key"] for p in everything["partitions"]] == [
        "big",
        "also-mid",
        "mid",
        "small",
    ]
    assert everything["next_after"] is None


def test_running_jobs_count_per_key(api: httpx.Client, queue: Queue) -> None:
    queue.enqueue("t", queue="work", partition_key="a")
    queue.enqueue("t", queue="work", partition_key="a")
    [claimed] = WorkerProtocol(queue).claim(["work"], ["t"])
    assert claimed.partition_key == "a"
    [a] = api.get("/queues/work/partitions").json()["partitions"]
    assert (a["partition_key"], a["queued"], a["running"]) == ("a", 1, 1)


def test_partitions_of_an_unknown_queue_are_404_and_bad_paging_422(
    api: httpx.Client, queue: Queue
) -> None:
    answer = api.get("/queues/nowhere/partitions")
    assert answer.status_code == 404
    assert answer.json()["detail"] == "queue 'nowhere' not found"
    assert api.get("/queues/nowhere").status_code == 404
    queue.enqueue("t", queue="work", partition_key="a")
    for params, field in (
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"limit": "many"}, "limit"),
        ({"after": "not a cursor"}, "after"),
    ):
        bad = api.get("/queues/work/partitions", params=params)
        assert bad.status_code == 422, (params, bad.text)
        assert [error["field"] for error in bad.json()["errors"]] == [field], params
    # A queue with settings and no job is a queue: an empty list, not 404.
    queue.update_queue("fresh", partition_concurrency_limit=1, create=True)
    assert api.get("/queues/fresh/partitions").json() == {"partitions": [], "next_after": None}


def test_metrics_count_throttled_partitions_per_queue(api: httpx.Client, queue: Queue) -> None:
    for key in ("a", "b", "c"):
        queue.enqueue("t", queue="work", partition_key=key)
    queue.enqueue("t", queue="calm", partition_key="a")
    queue.throttle("work", 300, partition_key="a")
    queue.throttle("work", 300, partition_key="b")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(api.get("/metrics").text)
        for sample in family.samples
        if sample.name == "pgqueue_throttled_partitions"
    }
    assert samples == {
        ("pgqueue_throttled_partitions", (("queue", "calm"),)): 0,
        ("pgqueue_throttled_partitions", (("queue", "work"),)): 2,
    }
