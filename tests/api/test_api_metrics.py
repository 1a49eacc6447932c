"""/metrics, parsed with prometheus_client's own parser, against known job counts."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
from prometheus_client.parser import text_string_to_metric_families

from pgqueue import JobState, Queue, WorkerProtocol


def _scrape(api: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = api.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _jobs(samples, queue: str, state: str) -> float:
    return samples[("pgqueue_jobs", (("queue", queue), ("state", state)))]


def _per_queue(samples, name: str, queue: str, **labels: str) -> float:
    return samples[(name, tuple(sorted({"queue": queue, **labels}.items())))]


def _enqueue(api: httpx.Client, count: int, **fields) -> list[int]:
    body = {"jobs": [{"task": "echo", **fields} for _ in range(count)]}
    return [item["job"]["id"] for item in api.post("/jobs/batch", json=body).json()["items"]]


def test_metrics_match_known_job_counts(api: httpx.Client, queue: Queue):
    protocol = WorkerProtocol(queue)
    _enqueue(api, 5, queue="mail", max_attempts=1)
    _enqueue(api, 2, queue="reports", max_attempts=3)
    done, broken, _still_running = protocol.claim(["mail"], ["echo"], limit=3)
    protocol.ack(done, {"ok": True})
    protocol.fail(broken, "boom")  # max_attempts=1: dead
    api.post(f"/jobs/{queue.list(queue='mail', state='queued').jobs[0].id}/cancel")
    [retried] = protocol.claim(["reports"], ["echo"])
    protocol.fail(retried, "transient")  # back to queued

    samples = _scrape(api)
    assert {state.value: _jobs(samples, "mail", state.value) for state in JobState} == {
        "waiting": 0,
        "queued": 1,
        "running": 1,
        "succeeded": 1,
        "dead": 1,
        "cancelled": 1,
    }
    assert _jobs(samples, "reports", "queued") == 2
    assert _per_queue(samples, "pgqueue_jobs_completed_total", "mail") == 1
    assert _per_queue(samples, "pgqueue_job_failures_total", "mail") == 1
    assert _per_queue(samples, "pgqueue_jobs_completed_total", "reports") == 0
    assert _per_queue(samples, "pgqueue_job_failures_total", "reports") == 1


def test_counters_survive_pruning_while_gauges_drop(api: httpx.Client, queue: Queue):
    protocol = WorkerProtocol(queue)
    _enqueue(api, 3, max_attempts=1)
    first, second = protocol.claim(["default"], ["echo"], limit=2)
    protocol.ack(first, None)
    protocol.fail(second, "boom")
    assert queue.prune(0) == 2

    samples = _scrape(api)
    assert _jobs(samples, "default", "succeeded") == 0
    assert _jobs(samples, "default", "dead") == 0
    assert _jobs(samples, "default", "queued") == 1
    assert _per_queue(samples, "pgqueue_jobs_completed_total", "default") == 1
    assert _per_queue(samples, "pgqueue_job_failures_total", "default") == 1


def test_gauges_stay_exact_under_concurrent_enqueue_claim_ack_and_fail(
    api: httpx.Client, queue: Queue
):
    failures = []
    lock = threading.Lock()

    def produce_and_work(worker: int) -> None:
        protocol = WorkerProtocol(queue)
        _enqueue(api, 40, queue=f"q{worker % 2}", max_attempts=2)
        for _ in range(6):
            jobs = protocol.claim(["q0", "q1"], ["echo"], limit=5)
            if not jobs:
                return
            protocol.ack_many([(job, None) for job in jobs[1:]])
            protocol.fail(jobs[0], "boom")
            with lock:
                failures.append(jobs[0].id)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(produce_and_work, range(4)))

    samples = _scrape(api)
    table = {q["queue"]: q["counts"] for q in api.get("/queues").json()["queues"]}
    for name, counts in table.items():
        for state, count in counts.items():
            assert _jobs(samples, name, state) == count, (name, state)
    completed = sum(_per_queue(samples, "pgqueue_jobs_completed_total", q) for q in table)
    failed = sum(_per_queue(samples, "pgqueue_job_failures_total", q) for q in table)
    assert completed == sum(counts["succeeded"] for counts in table.values())
    assert failures and failed == len(failures)
