"""POST /jobs and POST /jobs/batch: created, idempotent, committed, all or nothing."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
from psycopg import sql

from pgqueue import Queue


def _count_jobs(db: psycopg.Connection, schema: str) -> int:
    query = sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(schema))
    return db.execute(query).fetchone()[0]


def test_post_job_creates_it_with_defaults_and_returns_201(api: httpx.Client):
    response = api.post("/jobs", json={"task": "echo", "payload": {"x": [1, "two"]}})
    assert response.status_code == 201
    job = response.json()
    assert job["task"] == "echo" and job["payload"] == {"x": [1, "two"]}
    assert job["queue"] == "default" and job["priority"] == 0 and job["max_attempts"] == 5
    assert job["state"] == "queued" and job["attempts"] == 0
    assert job["started_at"] is None and job["finished_at"] is None
    assert "lease_token" not in job


def test_post_job_answers_only_after_the_insert_committed(api: httpx.Client, db, schema):
    job = api.post("/jobs", json={"task": "echo"}).json()
    # A separate connection sees the row at once: the answer came after the commit.
    query = sql.SQL("SELECT state::text FROM {}.jobs WHERE id = %s").format(sql.Identifier(schema))
    assert db.execute(query, (job["id"],)).fetchone() == ("queued",)


def test_post_job_stores_every_option(api: httpx.Client):
    run_at = datetime.now(UTC) + timedelta(hours=1)
    job = api.post(
        "/jobs",
        json={
            "task": "report.build",
            "payload": {"id": 7},
            "queue": "reports",
            "priority": 10,
            "run_at": run_at.isoformat(),
            "idempotency_key": "report-7",
            "max_attempts": 3,
            "timeout_seconds": 2.5,
        },
    ).json()
    assert job["queue"] == "reports" and job["priority"] == 10 and job["max_attempts"] == 3
    assert job["idempotency_key"] == "report-7" and job["timeout_seconds"] == 2.5
    assert datetime.fromisoformat(job["run_at"]) == run_at


def test_delay_seconds_moves_run_at_after_enqueued_at(api: httpx.Client):
    job = api.post("/jobs", json={"task": "echo", "delay_seconds": 3600}).json()
    delay = datetime.fromisoformat(job["run_at"]) - datetime.fromisoformat(job["enqueued_at"])
    assert delay == timedelta(hours=1)


def test_duplicate_idempotency_key_returns_200_with_the_existing_job(api: httpx.Client):
    first = api.post("/jobs", json={"task": "echo", "idempotency_key": "once"})
    second = api.post("/jobs", json={"task": "echo", "idempotency_key": "once", "priority": 3})
    assert (first.status_code, second.status_code) == (201, 200)
    assert second.json() == first.json()


def test_ten_concurrent_duplicates_give_one_201_and_nine_200_for_one_job(
    api: httpx.Client, db, schema
):
    start = threading.Barrier(10)

    def post(_: int) -> httpx.Response:
        start.wait()
        return api.post("/jobs", json={"task": "echo", "idempotency_key": "race"})

    with ThreadPoolExecutor(10) as pool:
        responses = list(pool.map(post, range(10)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] * 9 + [201]
    assert len({r.json()["id"] for r in responses}) == 1
    assert _count_jobs(db, schema) == 1


def test_batch_returns_jobs_in_request_order_with_created_flags(api: httpx.Client):
    existing = api.post("/jobs", json={"task": "echo", "idempotency_key": "old"}).json()
    response = api.post(
        "/jobs/batch",
        json={
            "jobs": [
                {"task": "a", "payload": {"n": 0}},
                {"task": "echo", "idempotency_key": "old"},
                {"task": "c", "idempotency_key": "new"},
                {"task": "c", "idempotency_key": "new"},
                {"task": "e", "queue": "other"},
            ]
        },
    )
    assert response.status_code == 201
    items = response.json()["items"]
    assert [item["created"] for item in items] == [True, False, True, False, True]
    assert items[1]["job"] == existing
    assert items[2]["job"]["id"] == items[3]["job"]["id"]
    assert [items[i]["job"]["task"] for i in (0, 2, 4)] == ["a", "c", "e"]
    assert items[0]["job"]["id"] < items[2]["job"]["id"] < items[4]["job"]["id"]
    assert items[4]["job"]["queue"] == "other"


def test_batch_of_a_thousand_jobs_is_accepted(api: httpx.Client, db, schema):
    jobs = [{"task": "echo", "payload": {"i": i}} for i in range(1000)]
    response = api.post("/jobs/batch", json={"jobs": jobs})
    assert response.status_code == 201
    assert [item["job"]["payload"]["i"] for item in response.json()["items"]] == list(range(1000))
    assert _count_jobs(db, schema) == 1000


def test_batch_with_one_bad_job_inserts_none_and_names_it(api: httpx.Client, db, schema):
    jobs = [{"task": "echo"}, {"task": "echo"}, {"task": "echo", "payload": {"x": "a\u0000b"}}]
    response = api.post("/jobs/batch", json={"jobs": jobs})
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "jobs[2].payload"
    assert _count_jobs(db, schema) == 0


def test_batch_over_a_thousand_jobs_or_empty_is_refused(api: httpx.Client, db, schema):
    too_many = api.post("/jobs/batch", json={"jobs": [{"task": "echo"}] * 1001})
    empty = api.post("/jobs/batch", json={"jobs": []})
    assert (too_many.status_code, empty.status_code) == (422, 422)
    assert too_many.json()["errors"][0]["field"] == "jobs"
    assert _count_jobs(db, schema) == 0


def test_batch_duplicates_racing_a_single_post_agree_on_one_job(api: httpx.Client, queue: Queue):
    start = threading.Barrier(2)

    def single() -> httpx.Response:
        start.wait()
        return api.post("/jobs", json={"task": "echo", "idempotency_key": "shared"})

    def batch() -> httpx.Response:
        start.wait()
        return api.post(
            "/jobs/batch", json={"jobs": [{"task": "echo", "idempotency_key": "shared"}]}
        )

    with ThreadPoolExecutor(2) as pool:
        one, many = pool.submit(single), pool.submit(batch)
        single_response, batch_response = one.result(), many.result()
    item = batch_response.json()["items"][0]
    assert single_response.json()["id"] == item["job"]["id"]
    assert (single_response.status_code == 201) != item["created"]
    assert queue.stats()[0].counts["queued"] == 1
