"""Jobs that wait for other jobs over HTTP: ``depends_on`` on POST /jobs and on each
item of POST /jobs/batch (``{"index": N}`` for an earlier item), both directions on
GET /jobs/{id}, ``?state=waiting``, and the waiting count in /queues and /metrics."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pgqueue import Queue, WorkerProtocol
from pgqueue_api import ApiSettings, create_app


def _post(api: httpx.Client, **fields: Any) -> dict[str, Any]:
    response = api.post("/jobs", json={"task": "echo", **fields})
    assert response.status_code == 201, response.text
    return response.json()


def _get(api: httpx.Client, job_id: int) -> dict[str, Any]:
    response = api.get(f"/jobs/{job_id}")
    assert response.status_code == 200, response.text
    return response.json()


def _run(queue: Queue, job_id: int, *, succeed: bool = True) -> None:
    """Claim the one runnable job, which must be ``job_id``, and ack or fail it."""
    protocol = WorkerProtocol(queue)
    [job] = protocol.claim(["default"], ["echo"])
    assert job.id == job_id
    if succeed:
        protocol.ack(job, None)
    else:
        protocol.fail(job, "boom")


def _job_count(queue: Queue) -> int:
    return sum(sum(stats.counts.values()) for stats in queue.stats())


def test_a_job_waits_for_its_dependencies_and_is_queued_by_the_last_ack(
    api: httpx.Client, queue: Queue
) -> None:
    first, second = _post(api), _post(api)
    job = _post(api, depends_on=[second["id"], first["id"], second["id"]])
    assert job["state"] == "waiting"
    assert "depends_on" not in job  # only GET /jobs/{id} reads the dependencies

    detail = _get(api, job["id"])
    assert detail["state"] == "waiting"
    assert (detail["depends_on"], detail["dependents"]) == ([first["id"], second["id"]], [])
    assert _get(api, first["id"])["dependents"] == [job["id"]]
    assert _get(api, first["id"])["depends_on"] == []

    _run(queue, first["id"])
    assert _get(api, job["id"])["state"] == "waiting"
    _run(queue, second["id"])
    assert _get(api, job["id"])["state"] == "queued"
    # The links stay once the job no longer waits.
    assert _get(api, job["id"])["depends_on"] == [first["id"], second["id"]]


def test_a_dependency_that_already_succeeded_is_met_and_a_dead_one_cancels(
    api: httpx.Client, queue: Queue
) -> None:
    done = _post(api)
    _run(queue, done["id"])
    dead = _post(api, max_attempts=1)
    _run(queue, dead["id"], succeed=False)

    assert _post(api, depends_on=[done["id"]])["state"] == "queued"
    cancelled = _post(api, depends_on=[done["id"], dead["id"]])
    assert cancelled["state"] == "cancelled"
    assert cancelled["last_error"] == f"dependency {dead['id']} ended dead"


def test_a_dependency_ending_dead_cancels_the_jobs_waiting_for_it_and_theirs(
    api: httpx.Client, queue: Queue
) -> None:
    root = _post(api, max_attempts=1)
    child = _post(api, depends_on=[root["id"]])
    grandchild = _post(api, depends_on=[child["id"]])
    _run(queue, root["id"], succeed=False)
    assert _get(api, child["id"])["state"] == "cancelled"
    assert _get(api, grandchild["id"])["state"] == "cancelled"
    assert _get(api, grandchild["id"])["last_error"] == f"dependency {child['id']} ended cancelled"


def test_cancelling_a_waiting_job_over_http_cancels_its_dependents(
    api: httpx.Client, queue: Queue
) -> None:
    root = _post(api)
    waiting = _post(api, depends_on=[root["id"]])
    dependent = _post(api, depends_on=[waiting["id"]])
    answer = api.post(f"/jobs/{waiting['id']}/cancel")
    assert answer.status_code == 200
    assert answer.json()["state"] == "cancelled"
    assert _get(api, dependent["id"])["state"] == "cancelled"
    assert _get(api, root["id"])["state"] == "queued"


def test_batch_items_depend_on_earlier_items_by_index_and_on_ids(
    api: httpx.Client, queue: Queue
) -> None:
    earlier = _post(api)
    body = {
        "jobs": [
            {"task": "echo"},
            {"task": "echo", "depends_on": [{"index": 0}]},
            {"task": "echo"},
            {"task": "echo", "depends_on": [{"index": 1}, earlier["id"], {"index": 0}]},
        ]
    }
    response = api.post("/jobs/batch", json=body)
    assert response.status_code == 201, response.text
    items = response.json()["items"]
    assert [item["created"] for item in items] == [True] * 4
    ids = [item["job"]["id"] for item in items]
    assert [item["job"]["state"] for item in items] == ["queued", "waiting", "queued", "waiting"]

    assert _get(api, ids[1])["depends_on"] == [ids[0]]
    assert _get(api, ids[3])["depends_on"] == sorted([earlier["id"], ids[0], ids[1]])
    assert _get(api, ids[0])["dependents"] == [ids[1], ids[3]]
    assert _get(api, earlier["id"])["dependents"] == [ids[3]]
    assert _get(api, ids[2])["depends_on"] == _get(api, ids[2])["dependents"] == []


def test_unknown_ids_are_422_naming_them_and_nothing_is_enqueued(
    api: httpx.Client, queue: Queue
) -> None:
    known = _post(api)
    before = _job_count(queue)
    answer = api.post("/jobs", json={"task": "echo", "depends_on": [999_999, known["id"], 888_888]})
    assert answer.status_code == 422
    body = answer.json()
    assert body["errors"] == [{"field": "depends_on", "message": "no jobs with id 888888, 999999"}]
    assert body["detail"] == "depends_on: no jobs with id 888888, 999999"
    assert _job_count(queue) == before
    assert _get(api, known["id"])["dependents"] == []


def test_an_unknown_id_in_a_batch_names_its_item_and_nothing_is_enqueued(
    api: httpx.Client, queue: Queue
) -> None:
    before = _job_count(queue)
    body = {
        "jobs": [
            {"task": "echo"},
            {"task": "echo", "depends_on": [{"index": 0}]},
            {"task": "echo", "depends_on": [{"index": 1}, 777_777]},
        ]
    }
    answer = api.post("/jobs/batch", json=body)
    assert answer.status_code == 422
    assert answer.json()["errors"] == [
        {"field": "jobs[2].depends_on", "message": "no job with id 777777"}
    ]
    assert _job_count(queue) == before

    # A batch of one names its only item.
    answer = api.post("/jobs/batch", json={"jobs": [{"task": "echo", "depends_on": [666_666]}]})
    assert answer.status_code == 422
    assert answer.json()["errors"] == [
        {"field": "jobs[0].depends_on", "message": "no job with id 666666"}
    ]
    assert _job_count(queue) == before


@pytest.mark.parametrize(
    ("jobs", "field", "message"),
    [
        (
            [{"task": "echo", "depends_on": [{"index": 0}]}],
            "jobs[0].depends_on",
            "index 0 is not an earlier item of the batch",
        ),
        (
            [{"task": "echo"}, {"task": "echo", "depends_on": [{"index": 2}]}, {"task": "echo"}],
            "jobs[1].depends_on",
            "index 2 is not an earlier item of the batch",
        ),
    ],
)
def test_an_index_that_is_not_an_earlier_item_is_422(
    api: httpx.Client, queue: Queue, jobs: list[dict], field: str, message: str
) -> None:
    answer = api.post("/jobs/batch", json={"jobs": jobs})
    assert answer.status_code == 422
    assert answer.json()["errors"] == [{"field": field, "message": message}]
    assert _job_count(queue) == 0


JOB_ID_OR_INDEX = 'must be a job id (an integer from 1) or {"index": N} for an earlier item'


@pytest.mark.parametrize(
    ("depends_on", "field", "message"),
    [
        ("12", "jobs[1].depends_on", "Input should be a valid list"),
        ({"index": 0}, "jobs[1].depends_on", "Input should be a valid list"),
        (["12"], "jobs[1].depends_on[0]", JOB_ID_OR_INDEX),
        ([0], "jobs[1].depends_on[0]", JOB_ID_OR_INDEX),
        ([1.0], "jobs[1].depends_on[0]", JOB_ID_OR_INDEX),
        ([True], "jobs[1].depends_on[0]", JOB_ID_OR_INDEX),
        ([None], "jobs[1].depends_on[0]", JOB_ID_OR_INDEX),
        ([2**63], "jobs[1].depends_on[0]", JOB_ID_OR_INDEX),
        ([{"index": "0"}], "jobs[1].depends_on[0]", 'given as {"index": N}'),
        ([{"index": True}], "jobs[1].depends_on[0]", 'given as {"index": N}'),
        ([{"idx": 0}], "jobs[1].depends_on[0]", 'given as {"index": N}'),
        ([{"index": 0, "job": 1}], "jobs[1].depends_on[0]", 'given as {"index": N}'),
        ([{"index": -1}], "jobs[1].depends_on[0]", "index must be from 0 to 999"),
    ],
)
def test_a_batch_dependency_of_the_wrong_type_is_422_naming_it(
    api: httpx.Client, queue: Queue, depends_on: Any, field: str, message: str
) -> None:
    body = {"jobs": [{"task": "echo"}, {"task": "echo", "depends_on": depends_on}]}
    answer = api.post("/jobs/batch", json=body)
    assert answer.status_code == 422
    [error] = answer.json()["errors"]
    assert error["field"] == field
    assert message in error["message"]
    assert _job_count(queue) == 0


@pytest.mark.parametrize(
    ("depends_on", "field", "message"),
    [
        (7, "depends_on", "Input should be a valid list"),
        (["7"], "depends_on[0]", "Input should be a valid integer"),
        ([0], "depends_on[0]", "Input should be greater than or equal to 1"),
        ([7.5], "depends_on[0]", "Input should be a valid integer"),
        ([False], "depends_on[0]", "Input should be a valid integer"),
        # One job has no batch: an index means nothing here.
        ([{"index": 0}], "depends_on[0]", "Input should be a valid integer"),
    ],
)
def test_a_dependency_of_the_wrong_type_is_422_naming_it(
    api: httpx.Client, queue: Queue, depends_on: Any, field: str, message: str
) -> None:
    answer = api.post("/jobs", json={"task": "echo", "depends_on": depends_on})
    assert answer.status_code == 422
    assert answer.json()["errors"] == [{"field": field, "message": message}]
    assert _job_count(queue) == 0


def test_list_filters_waiting_jobs_without_their_dependencies(
    api: httpx.Client, queue: Queue
) -> None:
    root = _post(api)
    first = _post(api, depends_on=[root["id"]])
    second = _post(api, depends_on=[first["id"]])
    answer = api.get("/jobs", params={"state": "waiting"})
    assert answer.status_code == 200
    jobs = answer.json()["jobs"]
    assert [job["id"] for job in jobs] == [second["id"], first["id"]]
    # A page of jobs leaves out both directions (they would cost a query per job).
    assert not {"depends_on", "dependents"} & set(jobs[0])
    assert [job["id"] for job in api.get("/jobs?state=queued").json()["jobs"]] == [root["id"]]


def test_queues_and_metrics_count_waiting_jobs(api: httpx.Client, queue: Queue) -> None:
    root = _post(api, queue="mail")
    for _ in range(2):
        _post(api, queue="mail", depends_on=[root["id"]])
    [mail] = [q for q in api.get("/queues").json()["queues"] if q["queue"] == "mail"]
    assert mail["counts"] == {
        "waiting": 2,
        "queued": 1,
        "running": 0,
        "succeeded": 0,
        "dead": 0,
        "cancelled": 0,
    }
    # Waiting jobs are not runnable: only the root is unserved.
    assert mail["unserved"] == {"echo": 1}

    samples = {
        sample.labels["state"]: sample.value
        for family in text_string_to_metric_families(api.get("/metrics").text)
        for sample in family.samples
        if sample.name == "pgqueue_jobs" and sample.labels["queue"] == "mail"
    }
    assert samples == {
        "waiting": 2,
        "queued": 1,
        "running": 0,
        "succeeded": 0,
        "dead": 0,
        "cancelled": 0,
    }


def test_openapi_documents_the_dependency_fields() -> None:
    spec = create_app(ApiSettings(database_url="postgresql://")).openapi()
    schemas = spec["components"]["schemas"]
    single = schemas["JobCreate"]["properties"]["depends_on"]
    assert single["type"] == "array" and single["items"]["minimum"] == 1
    batch_item = schemas["JobBatchCreate"]["properties"]["jobs"]["items"]["$ref"]
    in_batch = schemas[batch_item.rsplit("/", 1)[1]]["properties"]["depends_on"]
    assert {"$ref": "#/components/schemas/EarlierItem"} in in_batch["items"]["anyOf"]
    assert '{"index": N}' in in_batch["description"]
    detail = spec["paths"]["/jobs/{job_id}"]["get"]["responses"]["200"]
    assert detail["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/JobDetail"
    }
    assert {"depends_on", "dependents"} <= set(schemas["JobDetail"]["required"])
    assert "waiting" in schemas["JobState"]["enum"]
    assert "waiting" in schemas["StateCounts"]["required"]


def test_a_retried_dependent_waits_again_and_a_failed_dependency_refuses_it(
    api: httpx.Client, queue: Queue
) -> None:
    dependency = _post(api, max_attempts=1)
    other = _post(api)
    dependent = _post(api, depends_on=[dependency["id"], other["id"]])
    assert api.post(f"/jobs/{dependent['id']}/cancel").status_code == 200

    retried = api.post(f"/jobs/{dependent['id']}/retry")
    assert retried.status_code == 200, retried.text
    assert retried.json()["state"] == "waiting"
    assert queue.get(dependent["id"]).state.value == "waiting"

    _run(queue, dependency["id"], succeed=False)  # dead: cancels the dependent again
    assert _get(api, dependent["id"])["state"] == "cancelled"
    refused = api.post(f"/jobs/{dependent['id']}/retry")
    assert refused.status_code == 409
    assert refused.json() == {
        "detail": f"cannot retry job {dependent['id']}: its dependency {dependency['id']} "
        "(dead) will not succeed; retry it first",
        "errors": [{"field": "depends_on", "message": f"job {dependency['id']} ended dead"}],
    }
    assert _get(api, dependent["id"])["state"] == "cancelled"


def test_dependency_mode_finished_on_a_job_and_a_batch_item_is_shown_and_released_by_a_death(
    api: httpx.Client, queue: Queue
) -> None:
    doomed = _post(api, max_attempts=1)
    callback = _post(api, depends_on=[doomed["id"]], dependency_mode="finished")
    batch = api.post(
        "/jobs/batch",
        json={
            "jobs": [
                {"task": "other", "depends_on": [doomed["id"]]},
                {"task": "other", "depends_on": [{"index": 0}], "dependency_mode": "finished"},
            ]
        },
    )
    assert batch.status_code == 201, batch.text
    strict, batch_callback = (item["job"]["id"] for item in batch.json()["items"])
    assert _get(api, callback["id"])["dependency_mode"] == "finished"
    assert _get(api, batch_callback)["dependency_mode"] == "finished"
    assert _get(api, strict)["dependency_mode"] == "succeeded"
    assert _get(api, doomed["id"])["dependency_mode"] == "succeeded"

    _run(queue, doomed["id"], succeed=False)
    assert _get(api, callback["id"])["state"] == "queued"
    assert _get(api, strict)["state"] == "cancelled"
    assert _get(api, batch_callback)["state"] == "queued"


@pytest.mark.parametrize("mode", ["any", "", 1, None])
def test_an_unknown_dependency_mode_is_422_naming_the_field(
    api: httpx.Client, queue: Queue, mode: Any
) -> None:
    answer = api.post("/jobs", json={"task": "echo", "dependency_mode": mode})
    assert answer.status_code == 422, answer.text
    [error] = answer.json()["errors"]
    assert error["field"] == "dependency_mode"
    assert "succeeded" in error["message"] and "finished" in error["message"]
    answer = api.post("/jobs/batch", json={"jobs": [{"task": "echo", "dependency_mode": mode}]})
    assert answer.status_code == 422, answer.text
    [error] = answer.json()["errors"]
    assert error["field"] == "jobs[0].dependency_mode"
    assert _job_count(queue) == 0
