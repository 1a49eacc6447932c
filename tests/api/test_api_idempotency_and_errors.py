"""The API's side of idempotency conflicts (409 naming what differs), of the error
history (GET /jobs/{id}) and of unserved tasks (/metrics)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from pgqueue import Queue, WorkerProtocol, WorkerRegistration


def _count_jobs(db: psycopg.Connection, schema: str) -> int:
    query = sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(schema))
    return db.execute(query).fetchone()[0]


def test_a_key_repeated_with_another_job_answers_409_naming_what_differs(
    api: httpx.Client, db, schema
) -> None:
    first = api.post("/jobs", json={"task": "charge", "payload": {"n": 1}, "idempotency_key": "k"})
    again = api.post("/jobs", json={"task": "charge", "payload": {"n": 1}, "idempotency_key": "k"})
    other = api.post("/jobs", json={"task": "refund", "payload": {"n": 2}, "idempotency_key": "k"})
    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 409)
    body = other.json()
    job_id = first.json()["id"]
    assert body["detail"].startswith(f"idempotency key 'k' belongs to job {job_id}, whose ")
    assert [error["field"] for error in body["errors"]] == ["task", "payload"]
    assert _count_jobs(db, schema) == 1


def test_a_batch_with_a_conflicting_item_answers_409_and_enqueues_nothing(
    api: httpx.Client, db, schema
) -> None:
    api.post("/jobs", json={"task": "charge", "idempotency_key": "k"})
    jobs = [{"task": "fresh"}, {"task": "charge", "queue": "other", "idempotency_key": "k"}]
    response = api.post("/jobs/batch", json={"jobs": jobs})
    assert response.status_code == 409
    body = response.json()
    assert body["detail"].startswith("jobs[1]: idempotency key 'k'")
    assert [error["field"] for error in body["errors"]] == ["jobs[1].queue"]
    assert _count_jobs(db, schema) == 1


def test_concurrent_differing_posts_give_one_201_and_409s(api: httpx.Client, db, schema) -> None:
    start = threading.Barrier(8)

    def post(n: int) -> httpx.Response:
        start.wait()
        return api.post("/jobs", json={"task": "charge", "payload": {"n": n % 2},
                                       "idempotency_key": "race"})  # fmt: skip

    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(post, range(8)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] * 3 + [201] + [409] * 4
    assert _count_jobs(db, schema) == 1


def test_get_job_shows_the_error_history_and_no_last_error_after_success(
    api: httpx.Client, queue: Queue, db, schema
) -> None:
    protocol = WorkerProtocol(queue)
    job_id = api.post("/jobs", json={"task": "t"}).json()["id"]
    (claimed,) = protocol.claim(["default"], ["t"], worker_id="w1")
    protocol.fail(claimed, "first try broke")
    assert api.get(f"/jobs/{job_id}").json()["last_error"] == "first try broke"
    db.execute(sql.SQL("UPDATE {}.active_jobs SET run_at = now()").format(sql.Identifier(schema)))
    (claimed,) = protocol.claim(["default"], ["t"], worker_id="w2")
    protocol.ack(claimed, "done")

    job = api.get(f"/jobs/{job_id}").json()
    assert job["state"] == "succeeded" and job["last_error"] is None
    [entry] = job["errors"]
    assert (entry["attempt"], entry["worker_id"], entry["error"]) == (1, "w1", "first try broke")
    assert datetime.fromisoformat(entry["failed_at"]) <= datetime.now(UTC)
    listed = api.get("/jobs").json()["jobs"]
    assert listed[0]["errors"] == job["errors"]


def test_metrics_show_unserved_jobs_per_queue_and_task(
    api: httpx.Client, queue: Queue, db, schema
) -> None:
    for _ in range(2):
        queue.enqueue("sendmial", queue="mail")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(api.get("/metrics").text)
        for sample in family.samples
    }
    assert samples[("pgqueue_unserved_jobs", (("queue", "mail"), ("task", "sendmial")))] == 2
    # Now a live worker serves that task in that queue.
    queue.register_worker(WorkerRegistration("w", ["mail"], ["sendmial"], 1, 30.0))
    text = api.get("/metrics").text
    assert "# TYPE pgqueue_unserved_jobs gauge" in text
    assert 'pgqueue_unserved_jobs{queue="mail"' not in text
