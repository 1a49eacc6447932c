"""/metrics' run-time histogram (counted by the ack statement) and the age of each
queue's oldest runnable job, parsed with prometheus_client's own parser."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from pgqueue import Queue, WorkerProtocol, queries

RUN = "pgqueue_job_run_seconds"


def _scrape(api: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = api.get("/metrics")
    assert response.status_code == 200
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _sample(samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def _ack_after(queue: Queue, db: psycopg.Connection, schema: str, task: str, seconds: float):
    """Claim one job of ``task`` and ack it as if it had run ``seconds``."""
    protocol = WorkerProtocol(queue)
    [job] = protocol.claim(["mail", "images"], [task])
    db.execute(
        sql.SQL(
            "UPDATE {}.active_jobs SET started_at = now() - make_interval(secs => %s) WHERE id = %s"
        ).format(sql.Identifier(schema)),
        (seconds, job.id),
    )
    protocol.ack(job, None)


def test_run_times_are_a_histogram_per_queue_and_task(api: httpx.Client, queue: Queue, db, schema):
    protocol = WorkerProtocol(queue)
    for _ in range(3):
        queue.enqueue("echo", queue="mail")
    queue.enqueue("resize", queue="images")
    _ack_after(queue, db, schema, "echo", 0.1)
    _ack_after(queue, db, schema, "echo", 2.0)
    _ack_after(queue, db, schema, "resize", 40.0)
    [failing] = protocol.claim(["mail"], ["echo"])
    protocol.fail(failing, "boom")  # failed attempts are not in it

    samples = _scrape(api)
    mail = {"queue": "mail", "task": "echo"}
    assert _sample(samples, f"{RUN}_bucket", **mail, le="0.05") == 0
    assert _sample(samples, f"{RUN}_bucket", **mail, le="0.25") == 1
    assert _sample(samples, f"{RUN}_bucket", **mail, le="1.0") == 1
    assert _sample(samples, f"{RUN}_bucket", **mail, le="2.5") == 2
    assert _sample(samples, f"{RUN}_bucket", **mail, le="+Inf") == 2
    assert _sample(samples, f"{RUN}_count", **mail) == 2
    assert 2.1 <= _sample(samples, f"{RUN}_sum", **mail) < 3.0
    images = {"queue": "images", "task": "resize"}
    assert _sample(samples, f"{RUN}_bucket", **images, le="30.0") == 0
    assert _sample(samples, f"{RUN}_bucket", **images, le="60.0") == 1

    # Counted as they happen, not read from the history: pruning leaves them be.
    assert queue.prune(0) == 3
    assert _sample(_scrape(api), f"{RUN}_count", **mail) == 2


def test_the_histogram_reads_only_its_own_small_table(queue: Queue, db, schema):
    statement = queries.bind("run_time_histogram", schema).as_string(None)
    [[plan]] = db.execute("EXPLAIN (FORMAT JSON) " + statement).fetchone()
    relations = set()

    def walk(node: dict) -> None:
        if "Relation Name" in node:
            relations.add(node["Relation Name"])
        for child in node.get("Plans", []):
            walk(child)

    walk(plan["Plan"] if isinstance(plan, dict) else json.loads(plan)["Plan"])
    assert relations == {"run_time_buckets"}


def test_the_oldest_runnable_job_age_per_queue(api: httpx.Client, queue: Queue):
    queue.enqueue("echo", queue="late", run_at=datetime.now(UTC) - timedelta(seconds=90))
    queue.enqueue("echo", queue="later", delay_seconds=3600)
    samples = _scrape(api)
    age = "pgqueue_queue_oldest_runnable_age_seconds"
    assert 89 <= _sample(samples, age, queue="late") < 600
    assert _sample(samples, age, queue="later") == 0
