"""``GET /jobs/{id}?wait=S``: the answer comes as soon as the job is final, woken by the
API process's one listening connection, or after S seconds with the job as it is; 500
waiting requests hold no more connections than an idle API, and the API answers other
requests meanwhile. The real app under uvicorn, on real PostgreSQL; jobs are finished by
the worker's own statements."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from api_support import RunningApi
from polling import wait_for

from pgqueue import Job, JobSpec, Queue, WorkerProtocol
from pgqueue_bench.scenarios.wait import raw_get


def connections_to(db: psycopg.Connection) -> int:
    """Connections to this test process's own database (each test process has one)."""
    row = db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0]) - 1  # not this one


def notified_api(start_api: Callable[..., RunningApi], **settings: Any) -> RunningApi:
    """An API whose job watcher re-reads states once a minute only: a wait that ends
    within a test's seconds was woken by an announcement."""
    running = start_api(**settings)
    running.app.state.queue.job_watcher().recheck_interval = 60.0
    return running


def claim(queue: Queue, limit: int = 1) -> tuple[WorkerProtocol, list[Job]]:
    protocol = WorkerProtocol(queue)
    return protocol, protocol.claim(["default"], ["t"], limit=limit)


@pytest.mark.parametrize("wait", ["0", "-1", "60.5", "abc", "nan", "inf", ""])
def test_a_wait_out_of_range_is_refused_with_a_clear_422(module_api: httpx.Client, wait) -> None:
    answer = module_api.get("/jobs/1", params={"wait": wait})
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert [error["field"] for error in body["errors"]] == ["wait"], body


def test_wait_answers_when_the_ack_announces_it_with_the_body_get_gives(
    start_api: Callable[..., RunningApi], queue: Queue
) -> None:
    api = notified_api(start_api)
    watcher = api.app.state.queue.job_watcher()
    latencies = []
    for n in range(5):
        job = queue.enqueue("t", {"n": n}).job
        protocol, [claimed] = claim(queue)
        acked_at: list[float] = []

        def ack(
            claimed: Job = claimed,
            n: int = n,
            protocol: WorkerProtocol = protocol,
            acked_at: list[float] = acked_at,
        ) -> None:
            # Once the wait is under way, and its job recorded (the watcher's next round).
            wait_for(lambda: watcher.waiting == 1, 10, what="the wait")
            time.sleep(0.2)
            protocol.ack(claimed, {"answer": n})
            acked_at.append(time.monotonic())

        thread = threading.Thread(target=ack)
        thread.start()
        answer = api.client.get(f"/jobs/{job.id}", params={"wait": 30})
        answered_at = time.monotonic()
        thread.join()
        assert answer.status_code == 200
        assert answer.json()["state"] == "succeeded" and answer.json()["result"] == {"answer": n}
        assert answer.json() == api.client.get(f"/jobs/{job.id}").json()
        latencies.append(answered_at - acked_at[0])
    # Each woken by the announcement: long before the watcher's re-check (60 s), which
    # is the only other way a wait ends early. How soon is measured by `pgqueue bench
    # wait` (results/wait.json), not asserted here.
    assert max(latencies) < 30, latencies


def test_wait_answers_at_the_timeout_with_the_current_state(
    start_api: Callable[..., RunningApi], queue: Queue
) -> None:
    api = notified_api(start_api)
    job = queue.enqueue("t").job
    claim(queue)
    started = time.monotonic()
    answer = api.client.get(f"/jobs/{job.id}", params={"wait": 0.5})
    took = time.monotonic() - started
    assert answer.status_code == 200 and answer.json()["state"] == "running"
    assert 0.5 <= took < 2.5
    # A final job answers at once, and a missing one is a 404.
    queue.cancel(job.id)
    started = time.monotonic()
    assert api.client.get(f"/jobs/{job.id}", params={"wait": 30}).json()["state"] == "cancelled"
    missing = api.client.get("/jobs/999999999", params={"wait": 30})
    assert missing.status_code == 404
    assert time.monotonic() - started < 2


def test_500_waiting_requests_share_one_connection_and_the_api_answers_meanwhile(
    start_api: Callable[..., RunningApi], queue: Queue, db: psycopg.Connection
) -> None:
    before = connections_to(db)
    api = notified_api(start_api)
    jobs = [item.job for item in queue.enqueue_many([JobSpec("t", {"n": n}) for n in range(500)])]
    protocol, claimed = claim(queue, limit=500)
    assert len(claimed) == 500
    figures: dict[str, Any] = {}

    async def main() -> list[tuple[int, Any, float]]:
        waits = [asyncio.create_task(raw_get(api.url, f"/jobs/{job.id}?wait=30")) for job in jobs]
        watcher = api.app.state.queue.job_watcher()
        started = time.monotonic()
        while watcher.waiting < 500:
            assert time.monotonic() - started < 30, watcher.waiting
            await asyncio.sleep(0.05)
        figures["connections_while_waiting"] = connections_to(db) - before
        # Other requests are answered promptly while the 500 wait.
        took = []
        async with httpx.AsyncClient(base_url=api.url, timeout=60) as client:
            for _ in range(10):
                asked = time.monotonic()
                created = await client.post("/jobs", json={"task": "other"})
                assert created.status_code == 201
                shown = await client.get(f"/jobs/{created.json()['id']}")
                assert shown.status_code == 200
                took.append(time.monotonic() - asked)
        figures["other_request_pair_seconds_max"] = round(max(took), 4)
        assert all(not wait.done() for wait in waits)
        acked = time.monotonic()
        await asyncio.to_thread(protocol.ack_many, [(job, None) for job in claimed])
        figures["ack_commit_seconds"] = round(time.monotonic() - acked, 4)
        while watcher.waiting:
            await asyncio.sleep(0.01)
        figures["all_500_woken_after_ack_seconds"] = round(time.monotonic() - acked, 4)
        answers = await asyncio.gather(*waits)
        figures["first_answer_after_ack_seconds"] = round(min(a[2] for a in answers) - acked, 4)
        figures["all_500_answered_after_ack_seconds"] = round(max(a[2] for a in answers) - acked, 4)
        figures["connections_after"] = connections_to(db) - before
        return answers

    answers = asyncio.run(main())
    assert [status for status, _, _ in answers] == [200] * 500
    assert {body["state"] for _, body, _ in answers} == {"succeeded"}
    # The API's connections, its pools' and its watcher's: a handful, not one per wait.
    assert figures["connections_while_waiting"] <= 5, figures
    # Promptly: a small part of the waits' 30 s even on a loaded machine.
    assert figures["other_request_pair_seconds_max"] < 5.0, figures
    # Woken by the announcements, long before the 60 s re-check.
    assert figures["all_500_woken_after_ack_seconds"] < 5, figures
    assert figures["all_500_answered_after_ack_seconds"] < 10, figures
    print(json.dumps(figures))
    figures_path = os.environ.get("PGQUEUE_WAIT_FIGURES")
    if figures_path:
        Path(figures_path).write_text(json.dumps(figures, indent=2) + "\n")
