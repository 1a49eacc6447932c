"""GET /jobs/{id}, GET /jobs, cancel, retry and GET /queues, on jobs in every state."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from pgqueue import LeaseLost, Queue, WorkerProtocol


def _enqueue(api: httpx.Client, **fields) -> dict:
    response = api.post("/jobs", json={"task": "echo", **fields})
    assert response.status_code == 201, response.text
    return response.json()


def test_get_job_shows_state_attempts_last_error_and_timestamps(api: httpx.Client, queue: Queue):
    protocol = WorkerProtocol(queue)
    created = _enqueue(api, payload={"n": 1}, max_attempts=2)
    [claimed] = protocol.claim(["default"], ["echo"])
    protocol.fail(claimed, "first try broke")
    job = api.get(f"/jobs/{created['id']}").json()
    assert job["state"] == "queued" and job["attempts"] == 1 and job["max_attempts"] == 2
    assert job["last_error"] == "first try broke"
    assert job["started_at"] is not None and job["finished_at"] is None
    assert datetime.fromisoformat(job["run_at"]) > datetime.fromisoformat(job["enqueued_at"])


def test_get_job_of_a_succeeded_job_has_its_result(api: httpx.Client, queue: Queue):
    protocol = WorkerProtocol(queue)
    created = _enqueue(api)
    [claimed] = protocol.claim(["default"], ["echo"])
    protocol.ack(claimed, {"answer": 42})
    job = api.get(f"/jobs/{created['id']}").json()
    assert job["state"] == "succeeded" and job["result"] == {"answer": 42}
    assert job["attempts"] == 1 and job["finished_at"] is not None
    assert job["worker_id"] == claimed.worker_id


def test_get_unknown_job_is_404(api: httpx.Client):
    response = api.get("/jobs/987654321")
    assert response.status_code == 404
    assert response.json()["detail"] == "job 987654321 not found"


@pytest.mark.parametrize("job_id", ["0", "-1", "abc", str(2**63)])
def test_job_ids_outside_bigint_or_not_numbers_are_422(api: httpx.Client, job_id: str):
    response = api.get(f"/jobs/{job_id}")
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "job_id"


def test_listing_is_newest_first_and_pages_with_a_cursor(api: httpx.Client):
    ids = [_enqueue(api, payload={"i": i})["id"] for i in range(5)]
    first = api.get("/jobs", params={"limit": 2}).json()
    assert [job["id"] for job in first["jobs"]] == ids[:-3:-1]
    second = api.get("/jobs", params={"limit": 2, "after": first["next_after"]}).json()
    third = api.get("/jobs", params={"limit": 2, "after": second["next_after"]}).json()
    assert [job["id"] for job in second["jobs"]] == [ids[2], ids[1]]
    assert [job["id"] for job in third["jobs"]] == [ids[0]]
    assert third["next_after"] is None


def test_listing_filters_by_queue_state_and_task(api: httpx.Client, queue: Queue):
    _enqueue(api, queue="mail")
    wanted = _enqueue(api, queue="mail", task="send")
    _enqueue(api, queue="other", task="send")
    api.post(f"/jobs/{_enqueue(api, queue='mail', task='send')['id']}/cancel")
    page = api.get("/jobs", params={"queue": "mail", "state": "queued", "task": "send"}).json()
    assert [job["id"] for job in page["jobs"]] == [wanted["id"]]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"state": "sleeping"}, "state"),
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"after": "x"}, "after"),
        ({"queue": ""}, "queue"),
        ({"task": "a\x00b"}, "task"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_listing_refuses_bad_parameters_naming_them(api: httpx.Client, params, field):
    response = api.get("/jobs", params=params)
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == field


def test_cancel_queued_job_returns_it_cancelled(api: httpx.Client):
    created = _enqueue(api)
    response = api.post(f"/jobs/{created['id']}/cancel")
    assert response.status_code == 200
    assert response.json()["state"] == "cancelled"
    assert response.json()["finished_at"] is not None


def test_cancel_running_job_revokes_its_lease(api: httpx.Client, queue: Queue):
    protocol = WorkerProtocol(queue)
    created = _enqueue(api)
    [claimed] = protocol.claim(["default"], ["echo"])
    assert api.post(f"/jobs/{created['id']}/cancel").json()["state"] == "cancelled"
    with pytest.raises(LeaseLost):
        protocol.ack(claimed, "too late")
    assert api.get(f"/jobs/{created['id']}").json()["state"] == "cancelled"


def test_cancelling_a_finished_job_is_409(api: httpx.Client, queue: Queue):
    protocol = WorkerProtocol(queue)
    created = _enqueue(api)
    [claimed] = protocol.claim(["default"], ["echo"])
    protocol.ack(claimed, None)
    response = api.post(f"/jobs/{created['id']}/cancel")
    assert response.status_code == 409
    assert response.json()["detail"] == f"cannot cancel job {created['id']}: it is succeeded"


def test_cancel_or_retry_of_an_unknown_job_is_404(api: httpx.Client):
    assert api.post("/jobs/55555/cancel").status_code == 404
    assert api.post("/jobs/55555/retry").status_code == 404


def test_retry_puts_a_dead_job_back_runnable_with_attempts_reset(api: httpx.Client, queue: Queue):
    protocol = WorkerProtocol(queue)
    created = _enqueue(
        api, max_attempts=1, run_at=(datetime.now(UTC) - timedelta(hours=1)).isoformat()
    )
    [claimed] = protocol.claim(["default"], ["echo"])
    assert protocol.fail(claimed, "boom").state.value == "dead"
    response = api.post(f"/jobs/{created['id']}/retry")
    assert response.status_code == 200
    job = response.json()
    assert job["state"] == "queued" and job["attempts"] == 0
    assert datetime.fromisoformat(job["run_at"]) > datetime.fromisoformat(created["run_at"])
    assert [j.id for j in protocol.claim(["default"], ["echo"])] == [created["id"]]


def test_retry_of_a_cancelled_job_works_and_of_a_queued_job_is_409(api: httpx.Client):
    created = _enqueue(api)
    assert api.post(f"/jobs/{created['id']}/retry").status_code == 409
    api.post(f"/jobs/{created['id']}/cancel")
    assert api.post(f"/jobs/{created['id']}/retry").json()["state"] == "queued"


def test_queues_counts_jobs_by_state_and_ages_the_oldest_runnable(api: httpx.Client, queue: Queue):
    protocol = WorkerProtocol(queue)
    for _ in range(3):
        _enqueue(api, queue="mail")
    _enqueue(api, queue="later", delay_seconds=3600)
    [claimed] = protocol.claim(["mail"], ["echo"])
    protocol.ack(claimed, None)
    queues = {q["queue"]: q for q in api.get("/queues").json()["queues"]}
    assert queues["mail"]["counts"] == {
        "waiting": 0,
        "queued": 2,
        "running": 0,
        "succeeded": 1,
        "dead": 0,
        "cancelled": 0,
    }
    assert queues["mail"]["oldest_runnable_age_seconds"] >= 0
    assert queues["later"]["counts"]["queued"] == 1
    assert queues["later"]["oldest_runnable_age_seconds"] is None
