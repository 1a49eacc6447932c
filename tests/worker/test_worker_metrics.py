"""``pgqueue worker --metrics-port``: a real worker process, scraped over HTTP and read
with prometheus_client's own parser."""

from __future__ import annotations

import signal
import socket

import httpx
import pytest
from polling import wait_for
from prometheus_client.parser import text_string_to_metric_families
from worker_support import FAST, wait_until_state

from pgqueue import JobState, Queue
from pgqueue_worker.outage import DatabaseHealth

pytestmark = pytest.mark.slow

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port: int) -> Samples:
    """Every sample the worker serves, by name and labels."""
    answer = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert answer.status_code == 200
    samples = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_worker_serves_its_own_metrics(start_worker, queue: Queue) -> None:
    echoes = [queue.enqueue("echo", {"n": n}).job for n in range(5)]
    # Long enough for heartbeats (every 0.25 s) to extend its lease while it runs.
    slow = queue.enqueue("sleep", {"seconds": 1.0}, queue="slow").job
    fail = queue.enqueue("fail", {"message": "no luck"}, max_attempts=1).job
    port = free_port()
    worker = start_worker(*FAST, "--queue", "default,slow", "--metrics-port", str(port))
    for job in [*echoes, slow]:
        wait_until_state(queue, job.id, JobState.SUCCEEDED)
    wait_until_state(queue, fail.id, JobState.DEAD)

    def settled() -> Samples | None:
        samples = scrape(port)
        attempts = {
            outcome: value(samples, "pgqueue_worker_attempts_total", outcome=outcome)
            for outcome in ("succeeded", "failed")
        }
        return samples if attempts == {"succeeded": 6, "failed": 1} else None

    samples = wait_for(settled, 30, what="the worker to count its attempts")
    # Handler run times per queue and task: the sleeper's in its bucket.
    duration = "pgqueue_worker_job_duration_seconds"
    assert value(samples, f"{duration}_count", queue="default", task="echo") == 5
    assert value(samples, f"{duration}_count", queue="default", task="fail") == 1
    assert value(samples, f"{duration}_count", queue="slow", task="sleep") == 1
    assert value(samples, f"{duration}_bucket", queue="slow", task="sleep", le="0.5") == 0
    assert value(samples, f"{duration}_bucket", queue="slow", task="sleep", le="2.5") == 1
    assert value(samples, f"{duration}_sum", queue="slow", task="sleep") >= 1.0
    # Every job claimed once: claim sizes add up, and each job's wait was observed.
    assert value(samples, "pgqueue_worker_claim_jobs_sum") == 7
    assert value(samples, "pgqueue_worker_claim_jobs_count") >= 1
    pickups = value(samples, "pgqueue_worker_pickup_seconds_count", queue="default")
    assert pickups + value(samples, "pgqueue_worker_pickup_seconds_count", queue="slow") == 7
    # Database round trips: heartbeats while the sleeper ran, acks and the one failure.
    assert value(samples, "pgqueue_worker_heartbeat_seconds_count") >= 1
    assert value(samples, "pgqueue_worker_outcome_write_seconds_count") >= 1
    assert value(samples, "pgqueue_worker_attempts_total", outcome="lost") == 0
    assert value(samples, "pgqueue_worker_database_up") == 1
    assert value(samples, "pgqueue_worker_database_errors_total") == 0
    assert value(samples, "pgqueue_worker_database_outages_total") == 0
    assert value(samples, "pgqueue_worker_running_jobs") == 0
    assert value(samples, "pgqueue_worker_slots", kind="thread") == 32
    infos = [key for key in samples if key[0] == "pgqueue_worker_info"]
    assert len(infos) == 1
    # The process's own figures come along.
    assert value(samples, "process_resident_memory_bytes") > 0

    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    # The port is given back when the worker stops (a connection of the scrapes may
    # still be in TIME_WAIT on it, which a listener with SO_REUSEADDR ignores).
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("0.0.0.0", port))


def test_metrics_port_from_the_environment(start_worker, queue: Queue) -> None:
    job = queue.enqueue("echo", {"n": 1}).job
    port = free_port()
    worker = start_worker(*FAST, env={"PGQUEUE_WORKER_METRICS_PORT": str(port)})
    wait_until_state(queue, job.id, JobState.SUCCEEDED)
    samples = wait_for(
        lambda: (
            (s := scrape(port))
            and value(s, "pgqueue_worker_attempts_total", outcome="succeeded") == 1
            and s
        ),
        30,
        what="the worker to count its attempt",
    )
    assert (
        value(samples, "pgqueue_worker_job_duration_seconds_count", queue="default", task="echo")
        == 1
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


def test_a_taken_metrics_port_stops_the_worker_in_one_line(start_worker) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = start_worker("--metrics-port", str(port))
        assert worker.wait() == 1
    log = worker.log()
    assert f"cannot serve metrics on 0.0.0.0:{port}" in log
    assert "Traceback" not in log


def test_database_health_counts_failures_and_outages() -> None:
    health = DatabaseHealth()
    trouble = ConnectionError("connection refused")
    health.failed("claim loop", trouble)
    health.failed("heartbeat", trouble)
    health.succeeded()
    health.failed("claim loop", trouble)
    assert (health.failures, health.outages, health.down) == (3, 2, True)
