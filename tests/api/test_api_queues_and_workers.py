"""The operator's routes: queue settings (GET /queues, PATCH /queues/{name}, pause and
resume), the live workers (GET /workers), their metrics, and refusing jobs no worker
serves (--reject-unserved-tasks)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from api_support import RunningApi
from prometheus_client.parser import text_string_to_metric_families

from pgqueue import Queue, WorkerProtocol, WorkerRegistration

NO_PARTITION_SETTINGS = {
    "partition_concurrency_limit": None,
    "partition_rate_limit": None,
    "throttled_until": None,
}


def _worker(worker_id: str, queues: list[str], tasks: list[str]) -> WorkerRegistration:
    return WorkerRegistration(
        id=worker_id, queues=queues, tasks=tasks, concurrency=8, expiry_seconds=30.0
    )


def _queues(api: httpx.Client) -> dict[str, dict]:
    return {q["queue"]: q for q in api.get("/queues").json()["queues"]}


def test_queues_show_settings_and_patch_changes_only_what_is_given(
    api: httpx.Client, queue: Queue
) -> None:
    protocol = WorkerProtocol(queue)
    queue.enqueue("echo", queue="mail")
    mail = _queues(api)["mail"]
    assert (mail["paused"], mail["concurrency_limit"], mail["rate_limit"]) == (False, None, None)
    assert mail["unserved"] == {"echo": 1}

    answer = api.patch("/queues/mail", json={"concurrency_limit": 3, "rate_limit": 20})
    assert answer.status_code == 200
    assert answer.json() == {
        "queue": "mail",
        "paused": False,
        "concurrency_limit": 3,
        "rate_limit": 20.0,
        **NO_PARTITION_SETTINGS,
    }
    answer = api.patch("/queues/mail", json={"paused": True, "rate_limit": None})
    assert answer.json() == {
        "queue": "mail",
        "paused": True,
        "concurrency_limit": 3,
        "rate_limit": None,
        **NO_PARTITION_SETTINGS,
    }
    mail = _queues(api)["mail"]
    assert (mail["paused"], mail["concurrency_limit"], mail["rate_limit"]) == (True, 3, None)
    assert protocol.claim(["mail"], ["echo"]) == []


def test_pause_and_resume_are_shortcuts(api: httpx.Client, queue: Queue) -> None:
    protocol = WorkerProtocol(queue)
    queue.enqueue("echo")
    assert api.post("/queues/default/pause").json()["paused"] is True
    assert protocol.claim(["default"], ["echo"]) == []
    assert api.post("/queues/default/resume").json()["paused"] is False
    assert len(protocol.claim(["default"], ["echo"])) == 1


@pytest.mark.parametrize(
    "path", ["/queues/nowhere/pause", "/queues/nowhere/resume", "/queues/nowhere"]
)
def test_a_queue_that_never_existed_is_404(api: httpx.Client, path: str) -> None:
    patch = path.endswith("nowhere")
    answer = api.patch(path, json={"paused": True}) if patch else api.post(path)
    assert answer.status_code == 404
    assert answer.json()["detail"] == "queue 'nowhere' not found"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"concurrency_limit": -1}, "concurrency_limit"),
        ({"concurrency_limit": 2.5}, "concurrency_limit"),
        ({"rate_limit": 0}, "rate_limit"),
        ({"rate_limit": -5}, "rate_limit"),
        ({"rate_limit": "10"}, "rate_limit"),
        ({"paused": None}, "paused"),
        ({"paused": "yes"}, "paused"),
        ({"speed": 1}, "speed"),
    ],
)
def test_bad_settings_are_422_naming_the_field(
    api: httpx.Client, queue: Queue, body: dict, field: str
) -> None:
    queue.enqueue("echo")
    answer = api.patch("/queues/default", json=body)
    assert answer.status_code == 422
    assert [error["field"] for error in answer.json()["errors"]] == [field]
    assert _queues(api)["default"]["concurrency_limit"] is None


def test_nan_is_422(api: httpx.Client, queue: Queue) -> None:
    queue.enqueue("echo")
    answer = api.patch(
        "/queues/default",
        content=b'{"rate_limit": NaN}',
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 422


def test_workers_lists_the_live_workers_with_their_running_jobs(
    api: httpx.Client, queue: Queue
) -> None:
    protocol = WorkerProtocol(queue)
    assert api.get("/workers").json() == {"workers": []}
    queue.register_worker(_worker("h:1:a", ["default", "mail"], ["echo"]))
    queue.enqueue("echo")
    protocol.claim(["default"], ["echo"], worker_id="h:1:a")
    [worker] = api.get("/workers").json()["workers"]
    assert worker["id"] == "h:1:a"
    assert (worker["queues"], worker["tasks"], worker["concurrency"]) == (
        ["default", "mail"],
        ["echo"],
        8,
    )
    assert worker["running"] == 1
    assert worker["started_at"] <= worker["last_seen_at"]
    assert {"host", "pid", "version"} <= worker.keys()


def test_metrics_show_workers_per_queue_and_unserved_jobs(api: httpx.Client, queue: Queue) -> None:
    queue.register_worker(_worker("h:1:a", ["default", "mail"], ["echo"]))
    queue.register_worker(_worker("h:2:b", ["mail"], ["echo"]))
    queue.enqueue("sendmial", queue="mail")
    queue.enqueue("echo", queue="mail")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(api.get("/metrics").text)
        for sample in family.samples
    }
    assert samples[("pgqueue_workers", (("queue", "default"),))] == 1
    assert samples[("pgqueue_workers", (("queue", "mail"),))] == 2
    assert samples[("pgqueue_unserved_jobs", (("queue", "mail"), ("task", "sendmial")))] == 1
    assert ("pgqueue_unserved_jobs", (("queue", "mail"), ("task", "echo"))) not in samples


def test_rejecting_unserved_tasks_is_off_by_default_and_names_the_task_when_on(
    api: httpx.Client, start_api: Callable[..., RunningApi], queue: Queue
) -> None:
    assert api.post("/jobs", json={"task": "sendmial"}).status_code == 201
    strict = start_api(reject_unserved_tasks=True).client
    queue.register_worker(_worker("h:1:a", ["default"], ["send"]))
    answer = strict.post("/jobs", json={"task": "sendmial"})
    assert answer.status_code == 422
    assert answer.json()["errors"] == [
        {"field": "task", "message": "no live worker serves task 'sendmial' in queue 'default'"}
    ]
    assert strict.post("/jobs", json={"task": "send"}).status_code == 201
    batch = strict.post(
        "/jobs/batch", json={"jobs": [{"task": "send"}, {"task": "send", "queue": "other"}]}
    )
    assert batch.status_code == 422
    assert batch.json()["errors"][0]["field"] == "jobs[1].task"
    # Nothing of the refused batch was enqueued.
    assert queue.stats()[0].counts["queued"] == 2
