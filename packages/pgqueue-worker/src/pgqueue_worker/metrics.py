"""A worker process's own Prometheus metrics (``pgqueue worker --metrics-port``).

The API's ``/metrics`` says what the queues hold, from the database; these say what one
worker process does: how long its handlers run, how long jobs waited for it, how
large its claims are, how long its heartbeats and outcome writes take, and how often
the database failed it. Each process serves its own, on a port of its own, from a
private registry (with the process's CPU, memory and garbage-collector figures).

The counters the worker keeps anyway (attempts by outcome, database failures, slots)
are read when scraped; the histograms are observed as things happen, off the claim
loop where possible (handlers' run times on their slot's thread, claims on the
claimer's). A worker built without metrics pays one ``is None`` check per event.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from importlib import metadata
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    GC_COLLECTOR,
    CollectorRegistry,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from pgqueue_worker.claims import ClaimResult
    from pgqueue_worker.executor import Attempt
    from pgqueue_worker.worker import Worker

RUN_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
    900,
    3600,
)
PICKUP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
CLAIM_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
WRITE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class WorkerMetrics:
    """The metrics of one worker process's :class:`~pgqueue_worker.worker.Worker`, in
    their own ``registry``. Give it to the Worker (``Worker(..., metrics=...)``), and
    :meth:`serve` it over HTTP."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.registry.register(GC_COLLECTOR)
        self.job_duration = Histogram(
            "pgqueue_worker_job_duration_seconds",
            "How long handlers ran, per attempt, by queue and task (whether they returned "
            "or raised).",
            ["queue", "task"],
            buckets=RUN_BUCKETS,
            registry=self.registry,
        )
        self.pickup = Histogram(
            "pgqueue_worker_pickup_seconds",
            "Time from a job becoming runnable (the later of its enqueue and its run_at) "
            "to this worker claiming it, on the database clock, by queue.",
            ["queue"],
            buckets=PICKUP_BUCKETS,
            registry=self.registry,
        )
        self.claim_size = Histogram(
            "pgqueue_worker_claim_jobs",
            "Jobs each claim statement brought back.",
            buckets=CLAIM_BUCKETS,
            registry=self.registry,
        )
        self.heartbeat = Histogram(
            "pgqueue_worker_heartbeat_seconds",
            "How long each heartbeat (one statement extending every lease held) took.",
            buckets=WRITE_BUCKETS,
            registry=self.registry,
        )
        self.outcome_write = Histogram(
            "pgqueue_worker_outcome_write_seconds",
            "How long writing each batch of outcomes took (one statement for its successes "
            "and failures), with the lifecycle hooks run after its commit.",
            buckets=WRITE_BUCKETS,
            registry=self.registry,
        )
        # Children by label values: .labels() costs a lock and a tuple per call.
        self._job_duration: dict[tuple[str, str], Any] = {}
        self._pickup: dict[str, Any] = {}
        self._watching: _WorkerCollector | None = None

    def watch(self, worker: Worker) -> None:
        """Report ``worker``'s counters and gauges (read when scraped). The Worker calls
        it for the metrics it is given."""
        if self._watching is not None:
            raise ValueError("these metrics already watch a worker")
        self._watching = _WorkerCollector(worker)
        self.registry.register(self._watching)

    # -- observed as things happen (called from the worker's threads) -----------------

    def returned(self, attempt: Attempt) -> None:
        """A handler returned or raised, after ``attempt.ran_for`` seconds."""
        if attempt.ran_for is None:
            return  # called off before it started: it never ran
        job = attempt.job
        key = (job.queue, job.task)
        child = self._job_duration.get(key)
        if child is None:
            child = self._job_duration[key] = self.job_duration.labels(*key)
        child.observe(attempt.ran_for)

    def claimed(self, claim: ClaimResult) -> None:
        """A claim came back: its size, and how long each of its jobs waited for it."""
        if claim.error is not None:
            return
        self.claim_size.observe(len(claim.jobs))
        for job in claim.jobs:
            if job.started_at is None:
                continue
            runnable_since = max(job.run_at, job.enqueued_at)
            child = self._pickup.get(job.queue)
            if child is None:
                child = self._pickup[job.queue] = self.pickup.labels(job.queue)
            child.observe(max(0.0, (job.started_at - runnable_since).total_seconds()))

    def heartbeat_written(self, seconds: float) -> None:
        """A heartbeat statement took ``seconds``."""
        self.heartbeat.observe(seconds)

    def outcomes_written(self, seconds: float) -> None:
        """Writing a batch of outcomes took ``seconds``."""
        self.outcome_write.observe(seconds)

    # -- serving ------------------------------------------------------------------------

    def serve(self, port: int, host: str = "0.0.0.0") -> MetricsServer:
        """Serve the metrics at ``http://host:port/`` (any path) on a daemon thread.
        Raises OSError when the port cannot be listened on."""
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        return MetricsServer(server, thread)


class MetricsServer:
    """The HTTP server of :meth:`WorkerMetrics.serve`."""

    def __init__(self, server: Any, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        """The port it listens on (useful after serving on port 0)."""
        return int(self._server.server_address[1])

    def close(self) -> None:
        """Stop serving and free the port."""
        self._server.shutdown()
        self._server.server_close()


class _WorkerCollector(Collector):
    """The counters and gauges a Worker keeps anyway, read at each scrape."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        worker = self.worker
        counts = dict(worker.counts)  # a copy: the claim loop adds to it meanwhile
        health = worker._health
        attempts = CounterMetricFamily(
            "pgqueue_worker_attempts",
            "Attempts this worker finished, by outcome: succeeded (acked), failed (written "
            "as failed: raised, timed out, or a result that could not be stored), lost "
            "(outcome discarded: the job was cancelled or its lease lost), throttled (the "
            "handler raised Throttle: the job was put back without using up an attempt).",
            labels=["outcome"],
        )
        for outcome in ("succeeded", "failed", "lost", "throttled"):
            attempts.add_metric([outcome], counts.get(outcome, 0))
        yield attempts
        yield CounterMetricFamily(
            "pgqueue_worker_attempts_timed_out",
            "Attempts this worker called off for overrunning their time limit.",
            value=counts.get("timed_out", 0),
        )
        yield CounterMetricFamily(
            "pgqueue_worker_database_errors",
            "Database calls of this worker that failed for want of the database (claims, "
            "outcome writes, heartbeats, reaping, pruning), each retried.",
            value=health.failures,
        )
        yield CounterMetricFamily(
            "pgqueue_worker_database_outages",
            "Times the database became unavailable to this worker (a run of failures "
            "until the next write that went through counts once).",
            value=health.outages,
        )
        yield GaugeMetricFamily(
            "pgqueue_worker_database_up",
            "1 while the database takes this worker's writes, 0 during an outage.",
            value=0 if health.down else 1,
        )
        yield GaugeMetricFamily(
            "pgqueue_worker_running_jobs",
            "Attempts whose handler has not returned: running, or claimed ahead and "
            "waiting for a slot.",
            value=worker.running_jobs,
        )
        slots = GaugeMetricFamily(
            "pgqueue_worker_slots",
            "Handler slots: thread (plain def handlers) and async (coroutines).",
            labels=["kind"],
        )
        slots.add_metric(["thread"], worker.concurrency)
        slots.add_metric(["async"], worker.async_concurrency)
        yield slots
        info = GaugeMetricFamily(
            "pgqueue_worker_info",
            "Always 1: this worker's id and version (count them for the workers running).",
            labels=["worker_id", "version"],
        )
        info.add_metric([worker.worker_id, metadata.version("pgqueue-worker")], 1)
        yield info
